"""Verifiers: the AR model scoring drafts, on torch or on the native engine,
behind one contract (:class:`Verifier`, :class:`PassResult`)."""
from .base import PassResult, ScoreRules, Verifier
from ..model_shapes import UnsupportedModelError, check_supported
from .cached_decoder import CachedDecoderVerifier
from .native_verifier import NativeVerifier
from .torch_verifier import TorchVerifier, adjust_scores

__all__ = ["Verifier", "PassResult", "ScoreRules", "TorchVerifier", "NativeVerifier", "CachedDecoderVerifier",
           "UnsupportedModelError", "check_supported", "adjust_scores"]
