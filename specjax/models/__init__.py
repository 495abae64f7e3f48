"""specjax's T5 (``t5``, the public face of the modules by concern it lists) and the decode loops' view of it
(``adapter``), which imports the model and registers itself as ``model.DECODING_ADAPTER`` (what
``T5Model.decoding_model`` builds); importing this package (as importing ``specjax.models.t5`` does) does both."""

from specjax.models import adapter, t5  # noqa: F401
