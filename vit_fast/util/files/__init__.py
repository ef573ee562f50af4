"""The one way to write files: all of it or nothing at the target path, and never over a file we did not make.

Check before the work (``check_output_file`` and friends), write in a staging folder, publish at the end with every
claim re-checked; a file proves vit-fast wrote it by the digest of its own bytes it carries. The whole policy, and
which module holds each part: docs/files.md.
"""

from __future__ import annotations

from .base import (
    DIGEST_KEY,
    KEPT_MARK,
    MARKDOWN_MARK,
    MARKER_KEY,
    NAME_MAX,
    OWNER_FILE,
    OWNER_TEXT,
    PNG_DIGEST_KEY,
    PNG_KEY,
    PNG_VALUE,
    STAGING_MARK,
    OutputChanged,
    OutputNotWritable,
    nulled_streams,
    stdout_to_null,
    stdout_to_stderr,
    usable_standard_streams,
)
from .checks import (
    check_files_in,
    check_output_dir,
    check_output_file,
    check_report_file,
    check_suffix,
    existing_folder,
    make_folders,
    refuse_foreign,
    refuse_non_utf8,
    refuse_special,
)
from .claims import Identity, claim, claim_folder, identity
from .json_input import JSON_MAX_BYTES, JSON_MAX_DEPTH, JSON_MAX_INT_DIGITS, JSONInputError, loads_json, read_json
from .paths import contained_path, hold_lock
from .proof import (
    ARTIFACT_SUFFIXES,
    ENGINE_SUFFIXES,
    ONNX_SUFFIXES,
    is_artifact_metadata,
    ownership_note,
    read_json_object,
    seal_png,
    written_by_vit_fast,
)
from .publishing import publish, publish_folders, publish_to
from .reading import read_head, special_kind
from .staging import clean_stale_staging, is_our_staging, make_staging, staging_dir, temp_staging
from .writing import (
    copy_new,
    json_text,
    open_new,
    png_metadata,
    seal_markdown,
    write_atomic,
    write_json_atomic,
    write_new,
)

__all__ = [
    "ARTIFACT_SUFFIXES",
    "DIGEST_KEY",
    "ENGINE_SUFFIXES",
    "Identity",
    "JSONInputError",
    "JSON_MAX_BYTES",
    "JSON_MAX_DEPTH",
    "JSON_MAX_INT_DIGITS",
    "KEPT_MARK",
    "MARKDOWN_MARK",
    "MARKER_KEY",
    "NAME_MAX",
    "ONNX_SUFFIXES",
    "OWNER_FILE",
    "OWNER_TEXT",
    "OutputChanged",
    "OutputNotWritable",
    "PNG_DIGEST_KEY",
    "PNG_KEY",
    "PNG_VALUE",
    "STAGING_MARK",
    "check_files_in",
    "check_output_dir",
    "check_output_file",
    "check_report_file",
    "check_suffix",
    "claim",
    "claim_folder",
    "clean_stale_staging",
    "contained_path",
    "copy_new",
    "existing_folder",
    "hold_lock",
    "identity",
    "is_artifact_metadata",
    "is_our_staging",
    "json_text",
    "loads_json",
    "make_folders",
    "make_staging",
    "nulled_streams",
    "open_new",
    "ownership_note",
    "png_metadata",
    "publish",
    "publish_folders",
    "publish_to",
    "read_head",
    "read_json",
    "read_json_object",
    "refuse_foreign",
    "refuse_non_utf8",
    "refuse_special",
    "seal_markdown",
    "seal_png",
    "special_kind",
    "staging_dir",
    "stdout_to_null",
    "stdout_to_stderr",
    "temp_staging",
    "usable_standard_streams",
    "write_atomic",
    "write_json_atomic",
    "write_new",
    "written_by_vit_fast",
]
