"""Python's cyclic garbage collector paused while a whole input decodes (:func:`gc_paused`)."""
import contextlib
import gc
import threading

_lock = threading.Lock()
_depth = 0
_resume = False


@contextlib.contextmanager
def gc_paused():
    """Python's cyclic collector off for the block, and on again (if it was on)
    when the last block of the process under way ends, whichever thread's.

    A full collection walks every object the process holds: with a model, torch
    and fairseq loaded, several hundred thousand.  Streaming a few hundred
    sentences makes enough objects that outlive a pass (token lists, outputs)
    to start such collections over and over: about a tenth of an int8 decode's
    time at 32 rows.  Reference counting still frees at once whatever is not in
    a cycle; cycles made in the block wait for the first collection after it."""
    global _depth, _resume
    with _lock:
        if _depth == 0:
            _resume = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _resume:
                gc.enable()
