"""specjax's T5 (``t5``) and the decode loops' view of it (``adapter``), which imports the model and registers
itself as ``t5.DECODING_ADAPTER``; importing this package (as importing ``specjax.models.t5`` does) does both."""

from specjax.models import adapter, t5  # noqa: F401
