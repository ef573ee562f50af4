"""Which ops run a forward: what can run here (``runtime``), the triton ops and their checked twin
(``triton_path``), the first-use safety net, CUDA graphs and position-embedding resampling."""
