"""mmaccel: fast autoregressive generation on one speculative/parallel decoding core."""

from mmaccel.errors import InputError, MMAccelError, ModelNotFoundError

__version__ = "0.1.0"
__all__ = ["InputError", "MMAccelError", "ModelNotFoundError", "__version__"]
