"""specjax: speculative sampling (Leviathan et al. 2023, Algorithm 1) for T5 encoder-decoders in JAX/Flax.

The public API is re-exported here; modules are private. Heavy optional packages (TensorFlow, PyTorch,
transformers, matplotlib) are imported only by the functions that need them.
"""

from specjax.config import PRESETS, T5Config
from specjax.models.t5 import T5Model
from specjax.checkpoints import CheckpointError, load_checkpoint, save_checkpoint
from specjax.tokenizer import Tokenizer

__all__ = [
    "PRESETS", "T5Config", "T5Model", "CheckpointError", "load_checkpoint", "save_checkpoint", "Tokenizer",
]
__version__ = "0.1.0"
