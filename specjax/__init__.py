"""specjax: speculative sampling (Leviathan et al. 2023, Algorithm 1) for T5 encoder-decoders in JAX/Flax.

The public API is re-exported here; modules are private. Heavy optional packages (TensorFlow, PyTorch,
transformers, matplotlib) are imported only by the functions that need them.
"""

# First (its import runs early_setup): as the specjax command, Ctrl-C while importing exits 130 with one line.
from specjax import (
    _command,  # noqa: F401
    parallel,
)
from specjax.bulk import BulkDecoder, LineResult, generate_iterable
from specjax.checkpoints import CheckpointError, load_checkpoint, save_checkpoint
from specjax.config import PRESETS, T5Config
from specjax.decoder import Decoder
from specjax.decoding import DecodeConfig, DecodeResult, PromptLookupDraft, speculative_sample, temperature_sample
from specjax.defaults import load_default_pair
from specjax.models.t5 import T5Model
from specjax.parallel import data_parallel_sample, make_mesh, model_parallel_sample, shard_params
from specjax.seqio_interop import SeqioDecodeResult, seqio_decode  # imports seqio (TensorFlow) only when called
from specjax.tokenizer import Tokenizer

__all__ = [
    "PRESETS",
    "T5Config",
    "T5Model",
    "CheckpointError",
    "load_checkpoint",
    "save_checkpoint",
    "Tokenizer",
    "DecodeConfig",
    "DecodeResult",
    "Decoder",
    "BulkDecoder",
    "LineResult",
    "generate_iterable",
    "PromptLookupDraft",
    "speculative_sample",
    "temperature_sample",
    "load_default_pair",
    "parallel",
    "data_parallel_sample",
    "make_mesh",
    "model_parallel_sample",
    "shard_params",
    "seqio_decode",
    "SeqioDecodeResult",
]
__version__ = "0.2.0"
