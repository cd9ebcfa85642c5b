"""OpenPipe ART, imported so that it leaves transformers working: import ART only from here.

The submodules the trainers use (``art.loss``, ``art.preprocessing.*``, ``art.local``,
``art.metrics_taxonomy``, ``art.vllm_runtime``) are imported here too, so that they are
attributes of the ``art`` this module exports.

Two things happen when ``art`` is imported, and both are handled here:

* litellm, which ART imports, fetches a model cost map over the network unless
  ``LITELLM_LOCAL_MODEL_COST_MAP`` is set; offline that stalls the import for a long time.
* ART 0.5.18 replaces ``transformers.masking_utils._preprocess_mask_arguments`` with a wrapper
  written for the signature of transformers 5.2 (the version its GPU extra pins), which passes a
  ``cache_position`` argument. Newer transformers dropped that argument, so every forward pass
  would fail with a ``TypeError``: when the original takes no ``cache_position``, it is put
  back. With transformers 5.2 ART's patch stays, as ART intends.
"""

import inspect
import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import art
import art.local
import art.loss
import art.metrics_taxonomy
import art.preprocessing.inputs
import art.preprocessing.pack
import art.preprocessing.tokenize
import art.vllm_runtime
from art.transformers import patches
from transformers import masking_utils

_original = patches._preprocess_mask_arguments
if "cache_position" not in inspect.signature(_original).parameters:
    masking_utils._preprocess_mask_arguments = _original

__all__ = ["art"]
