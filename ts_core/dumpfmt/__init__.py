"""The one home of the dump format: record keys (build and parse), file and folder names,
the JSON files (read, atomic write), the shape of records, and reference statistics in numpy.

Everything that writes or reads a dump goes through here: the live writer, ``tsprobe
recover``, the compare loader and matcher, the TroubleShooter layout, the token map of
inference captures and its per-request split.
Needs only numpy.
"""
from .checksum import CRC32, XOR, checksum_kind, xor64_of_bytes, xor_field, xor_of_array
from .errors import DumpFormatError, TensorFileError
from .jsonio import (json_by_line, json_safe, record_json, read_json, read_json_optional, write_atomic, write_json_atomic,
                     write_text_atomic)
from .keys import (BACKWARD, DEBUG, FORWARD, MODULE_PREFIXES, OTHER, PARAMETERS_GRAD, KeyInfo, api_base, api_key, debug_key, forward_key,
                   module_base, module_key, params_grad_key, primitive_base, parse_key, split_module_name, value_name,
                   without_direction)
from .layout import (CONSTRUCT_JSON, DUMP_JSON, JOURNAL, MONITOR_JSONL, STACK_JSON, TENSORBOARD_DIR, TENSOR_DIR,
                     TOKEN_MAP, DumpUnit, find_dumps,
                     find_journal_dirs, is_rank_dir, parse_step_dir, rank_dir, rank_dir_name, rank_number,
                     step_dir_name, tensor_file_name, unit_for)
from .rankdir import (RankFiles, read_construct, read_header_and_data, read_rank_files, read_stacks, stack_groups,
                      write_rank_files)
from .records import INPUT, OUTPUT, PARAMETER, STAT_FIELDS, UNINITIALIZED, Entry, is_tensor_summary, map_summaries, record_entries
from ..native import crc32_hex     # the md5 field's CRC-32 (ISA-L when installed, else zlib)
from .refstats import reference_stats
from .shards import DTENSOR, dtensor_block, merge_shards, shard_stats
from .token_map import merge_token_maps, read_token_map, write_token_map
from .by_request import split_by_request
from .fingerprint import FINGERPRINT_JSON, read_fingerprint, write_fingerprint

__all__ = [
    "CRC32", "XOR", "checksum_kind", "xor64_of_bytes", "xor_field", "xor_of_array",
    "DumpFormatError", "TensorFileError",
    "json_by_line", "json_safe", "record_json", "read_json", "read_json_optional", "write_atomic", "write_json_atomic",
    "write_text_atomic",
    "BACKWARD", "DEBUG", "FORWARD", "MODULE_PREFIXES", "OTHER", "PARAMETERS_GRAD", "KeyInfo", "api_base", "api_key", "debug_key", "forward_key",
    "module_base", "module_key", "params_grad_key", "primitive_base", "parse_key", "split_module_name", "value_name",
    "without_direction",
    "CONSTRUCT_JSON", "DUMP_JSON", "JOURNAL", "MONITOR_JSONL", "STACK_JSON", "TENSORBOARD_DIR", "TENSOR_DIR",
    "TOKEN_MAP", "DumpUnit", "find_dumps",
    "find_journal_dirs", "is_rank_dir", "parse_step_dir", "rank_dir", "rank_dir_name", "rank_number",
    "step_dir_name", "tensor_file_name", "unit_for",
    "RankFiles", "read_construct", "read_header_and_data", "read_rank_files", "read_stacks", "stack_groups",
    "write_rank_files",
    "INPUT", "OUTPUT", "PARAMETER", "STAT_FIELDS", "UNINITIALIZED", "Entry", "is_tensor_summary", "map_summaries",
    "record_entries",
    "crc32_hex", "reference_stats",
    "DTENSOR", "dtensor_block", "merge_shards", "shard_stats",
    "merge_token_maps", "read_token_map", "write_token_map", "split_by_request",
    "FINGERPRINT_JSON", "read_fingerprint", "write_fingerprint",
]
