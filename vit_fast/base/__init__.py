"""The package's base layer, below the kernels: settings (``switches``), the card table (``cards``), version checks
(``versions``) and the interpreter switch (``interpret``). It imports nothing of vit-fast's."""
