"""An explicit-state model of the native engine's thread-pool protocol
(``fairseq_aggressive/native/csrc/pool/parallel.h``) and a checker that runs every
interleaving of its atomic steps for one caller and a few workers over a few
calls (:func:`explore`).

Every shared access of the protocol is one step of the model, in the order the
code makes it, with sequentially consistent atomics; the mutexes and condition
variables are modelled as what they guarantee (a mutex has one owner; a wait
releases the mutex and blocks until a notify, then takes the mutex again); the
bounded spins are a choice between seeing the awaited value (when it is there)
and giving up into the blocking path.  The per-worker ``busy`` marks and the
timeout of point 5 are left out: the model asks whether anything is ever lost,
so a call that would need the timeout shows as a deadlock.

``waiting_before_count=True`` models a worker that reads ``caller_waiting_``
before it adds its items to ``done_`` (the other order of a store/load pair of
point 4): the caller can go to sleep in between and never be woken.  (The
other pair, the workers' sleep, cannot deadlock a call: the caller claims
every item no worker took.)

``split_bound=True`` models a protocol whose claim reads the job's bound from a
field the caller stores apart from the job word (before it publishes the
word): a worker delayed between reading the word and reading the bound can
claim an item past the end of a finished job.

States that differ only by a permutation of the workers are explored once
(symmetry reduction: the workers run one code and differ only in their names;
136,919 states instead of 271,370 for calls of 2, 3 and 2 items on two workers).

Checked in every reachable state: an item runs only for the job whose claim it
won, at most once, below that job's item count; a call returns only when each
of its items ran exactly once; when no thread can move, the caller has made
every call (no deadlock, no lost wake-up).
"""
from typing import Dict, List, NamedTuple, Optional, Tuple


class Violation(NamedTuple):
    what: str
    trace: List[str]  # the steps from the initial state, "thread: step"


# Thread states are tuples (pc, ...locals); the shared state is a dict frozen
# into a tuple of (name, value) pairs for hashing.

def _freeze(shared: Dict) -> Tuple:
    return tuple(sorted(shared.items()))


def _canonical(shared: Dict, caller, workers: Tuple) -> Tuple:
    """The state with its workers in sorted order and the mutexes' owners renamed to match.
    The workers run one code and differ only in their names, so states that differ by a
    permutation of the workers have the same futures up to that permutation: exploring one
    of each (symmetry reduction) visits every behaviour, with fewer states."""
    order = sorted(range(len(workers)), key=lambda k: repr(workers[k]))
    if order != list(range(len(workers))):
        rename = {f"w{old}": f"w{new}" for new, old in enumerate(order)}
        shared = dict(shared, mu=rename.get(shared["mu"], shared["mu"]),
                      done_mu=rename.get(shared["done_mu"], shared["done_mu"]))
        workers = tuple(workers[k] for k in order)
    return _freeze(shared), caller, workers


def explore(items: Tuple[int, ...] = (2, 3), workers: int = 2, split_bound: bool = False,
            waiting_before_count: bool = False, max_states: int = 3_000_000) -> Tuple[Optional[Violation], int]:
    """Every interleaving of one caller making calls of ``items`` items each
    and ``workers`` workers.  Returns the first violation found (None if there
    is none) and the number of states explored."""
    assert all(n >= 2 for n in items), "calls of one item run on the caller alone"
    width = max(items) + 1
    shared0 = dict(gen=0, n=0, next=0, split_n=0, job=-1, done=0, sleepers=0, caller_waiting=False,
                   mu=None, done_mu=None, hits=tuple(0 for _ in range(len(items) * width)))
    caller0 = ("start", 0)  # (pc, call, ...)
    workers0 = tuple(("wait", 0) for _ in range(workers))  # (pc, seen, ...)
    start = (_freeze(shared0), caller0, workers0)

    def hit(sh, job, item):
        h = list(sh["hits"])
        h[job * width + item] += 1
        sh["hits"] = tuple(h)

    def call_ok(sh, c):
        row = sh["hits"][c * width:(c + 1) * width]
        return all(v == (1 if i < items[c] else 0) for i, v in enumerate(row))

    def bad_hits(sh):
        for c in range(len(items)):
            for i, v in enumerate(sh["hits"][c * width:(c + 1) * width]):
                if v > 1 or (i >= items[c] and v):
                    return f"call {c} item {i} ran {v} times"
        return None

    # ---------------------------------------------------------------- caller
    def caller_moves(sh, st):
        """[(label, new shared, new caller state)] from caller state st."""
        pc = st[0]
        out = []

        def go(label, new_st, **changes):
            s2 = dict(sh)
            s2.update(changes)
            out.append((label, s2, new_st))

        if pc == "start":
            c = st[1]
            if c == len(items):
                return out  # every call made
            go("job_ = f", ("reset", c), job=c)
        elif pc == "reset":
            c = st[1]
            go("done_ = 0", ("split", c) if split_bound else ("publish", c), done=0)
        elif pc == "split":
            go("split_n_ = n", ("publish", st[1]), split_n=items[st[1]])
        elif pc == "publish":
            c = st[1]
            go("word_ = (gen+1, n, 0)", ("sleepers", c), gen=sh["gen"] + 1, n=items[c], next=0)
        elif pc == "sleepers":
            c = st[1]
            if sh["sleepers"] > 0:
                go("sleepers_ > 0", ("notify_lock", c))
            else:
                go("sleepers_ == 0", ("claim", c, 0))
        elif pc == "notify_lock":
            if sh["mu"] is None:
                go("lock mu_", ("notify", st[1]), mu="caller")
        elif pc == "notify":
            go("notify_all; unlock mu_", ("claim", st[1], 0), mu=None, _notify_all=True)
        elif pc == "claim":  # load the word
            c, mine = st[1], st[2]
            go("load word_", ("claim_check", c, mine, (sh["gen"], sh["n"], sh["next"])))
        elif pc == "claim_check":
            c, mine, w = st[1], st[2], st[3]
            gen = c + 1
            if w[0] != gen:
                go("claim: other job", ("count", c, mine))
            elif split_bound:
                go("load split_n_", ("claim_bound", c, mine, w, sh["split_n"]))
            else:
                go("claim: bound from word", ("claim_bound", c, mine, w, w[1]))
        elif pc == "claim_bound":
            c, mine, w, n = st[1], st[2], st[3], st[4]
            if w[2] >= n:
                go("claim: none left", ("count", c, mine))
            elif (sh["gen"], sh["n"], sh["next"]) == w:
                s2 = dict(sh)
                s2["next"] = w[2] + 1
                hit(s2, c, w[2])  # the caller runs its own f
                out.append((f"CAS ok, run item {w[2]}", s2, ("claim", c, mine + 1)))
            else:
                go("CAS failed", ("claim_check", c, mine, (sh["gen"], sh["n"], sh["next"])))
        elif pc == "count":
            c, mine = st[1], st[2]
            done = sh["done"] + mine
            if done == items[c]:
                go(f"done_ += {mine} -> complete", ("returned", c), done=done)
            else:
                go(f"done_ += {mine}", ("wait_spin", c), done=done)
        elif pc == "wait_spin":
            c = st[1]
            if sh["done"] == items[c]:
                go("spin sees done_ == n", ("returned", c))
            go("spin gives up", ("wait_lock", c))
        elif pc == "wait_lock":
            if sh["done_mu"] is None:
                go("lock done_mu_", ("set_waiting", st[1]), done_mu="caller")
        elif pc == "set_waiting":
            go("caller_waiting_ = true", ("wait_check", st[1]), caller_waiting=True)
        elif pc == "wait_check":
            c = st[1]
            if sh["done"] == items[c]:
                go("done_ == n; caller_waiting_ = false; unlock", ("returned", c), done_mu=None,
                   caller_waiting=False)
            else:
                go("wait on done_cv_ (unlock)", ("cv_waiting", c), done_mu=None)
        elif pc == "cv_waiting":
            pass  # only a notify moves it (to "cv_woken")
        elif pc == "cv_woken":
            if sh["done_mu"] is None:
                go("woken: lock done_mu_", ("wait_check", st[1]), done_mu="caller")
        elif pc == "returned":
            c = st[1]
            go("run() returns", ("start", c + 1), _check_call=c)
        return out

    # ---------------------------------------------------------------- workers
    def worker_moves(sh, k, st):
        pc = st[0]
        me = f"w{k}"
        out = []

        def go(label, new_st, **changes):
            s2 = dict(sh)
            s2.update(changes)
            out.append((label, s2, new_st))

        if pc == "wait":  # spin for a new generation
            seen = st[1]
            if sh["gen"] != seen:
                go("spin sees a new job", ("read_gen", seen))
            go("spin gives up", ("sleep_inc", seen))
        elif pc == "sleep_inc":
            go("sleepers_ += 1", ("sleep_lock", st[1]), sleepers=sh["sleepers"] + 1)
        elif pc == "sleep_lock":
            if sh["mu"] is None:
                go("lock mu_", ("sleep_check", st[1]), mu=me)
        elif pc == "sleep_check":
            seen = st[1]
            if sh["gen"] != seen:
                go("fresh; unlock mu_", ("sleep_dec", seen), mu=None)
            else:
                go("wait on cv_ (unlock)", ("cv_waiting", seen), mu=None)
        elif pc == "cv_waiting":
            pass
        elif pc == "cv_woken":
            if sh["mu"] is None:
                go("woken: lock mu_", ("sleep_check", st[1]), mu=me)
        elif pc == "sleep_dec":
            go("sleepers_ -= 1", ("read_gen", st[1]), sleepers=sh["sleepers"] - 1)
        elif pc == "read_gen":
            go("gen = word_.gen", ("claim", sh["gen"], 0, 0))  # seen = gen from here on
        elif pc == "claim":
            gen, mine, n = st[1], st[2], st[3]
            go("load word_", ("claim_check", gen, mine, n, (sh["gen"], sh["n"], sh["next"])))
        elif pc == "claim_check":
            gen, mine, n, w = st[1], st[2], st[3], st[4]
            if w[0] != gen:
                go("claim: other job", ("count", gen, mine, n))
            elif split_bound:
                go("load split_n_", ("claim_bound", gen, mine, w, sh["split_n"]))
            else:
                go("claim: bound from word", ("claim_bound", gen, mine, w, w[1]))
        elif pc == "claim_bound":
            gen, mine, w, n = st[1], st[2], st[3], st[4]
            if w[2] >= n:
                go("claim: none left", ("count", gen, mine, n))
            elif (sh["gen"], sh["n"], sh["next"]) == w:
                go(f"CAS ok, item {w[2]}", ("run", gen, mine, n, w[2]), next=w[2] + 1)
            else:
                go("CAS failed", ("claim_check", gen, mine, n, (sh["gen"], sh["n"], sh["next"])))
        elif pc == "run":
            gen, mine, n, item = st[1], st[2], st[3], st[4]
            s2 = dict(sh)
            s2["_claimed_job"] = gen - 1
            if sh["job"] >= 0 and item < width:
                hit(s2, sh["job"], item)  # f = *job_, whatever job_ holds now
            out.append((f"run item {item} of job_ {sh['job']}", s2, ("claim", gen, mine + 1, n)))
        elif pc == "count":
            gen, mine, n = st[1], st[2], st[3]
            if mine == 0:
                go("nothing claimed", ("wait", gen))
            elif waiting_before_count:
                go("load caller_waiting_", ("late_count", gen, mine, n, sh["caller_waiting"]))
            else:
                done = sh["done"] + mine
                go(f"done_ += {mine}", ("notify_check", gen) if done == n else ("wait", gen), done=done)
        elif pc == "late_count":
            gen, mine, n, waiting = st[1], st[2], st[3], st[4]
            done = sh["done"] + mine
            last = done == n and waiting
            go(f"done_ += {mine}", ("notify_lock", gen) if last else ("wait", gen), done=done)
        elif pc == "notify_check":
            gen = st[1]
            if sh["caller_waiting"]:
                go("caller_waiting_", ("notify_lock", gen))
            else:
                go("caller not waiting", ("wait", gen))
        elif pc == "notify_lock":
            if sh["done_mu"] is None:
                go("lock done_mu_", ("notify", st[1]), done_mu=me)
        elif pc == "notify":
            go("notify_one; unlock done_mu_", ("wait", st[1]), done_mu=None, _notify_caller=True)
        return out

    # ---------------------------------------------------------------- search
    parent = {start: None}  # state -> (previous state, step), for the trace of a violation

    def trace(state, last=None):
        steps = [] if last is None else [last]
        while parent[state] is not None:
            state, step = parent[state]
            steps.append(step)
        return steps[::-1]

    stack = [start]
    while stack:
        state = stack.pop()
        frozen, caller, ws = state
        sh = dict(frozen)
        moves = [("caller", None, m) for m in caller_moves(sh, caller)]
        for k, st in enumerate(ws):
            moves += [(f"w{k}", k, m) for m in worker_moves(sh, k, st)]
        if not moves:
            if caller != ("start", len(items)):
                return Violation(f"deadlock: caller at {caller}, workers at {ws}", trace(state)), len(parent)
            continue
        for who, k, (label, s2, st2) in moves:
            step = f"{who}: {label}"
            c2, ws2 = (st2, ws) if k is None else (caller, ws[:k] + (st2,) + ws[k + 1:])
            if s2.pop("_notify_all", False):
                ws2 = tuple(("cv_woken",) + w[1:] if w[0] == "cv_waiting" else w for w in ws2)
            if s2.pop("_notify_caller", False) and c2[0] == "cv_waiting":
                c2 = ("cv_woken",) + c2[1:]
            claimed = s2.pop("_claimed_job", None)
            problem = None
            if claimed is not None and claimed != s2["job"]:
                problem = f"a claim of job {claimed} ran job_ {s2['job']}"
            c_done = s2.pop("_check_call", None)
            if c_done is not None and not call_ok(s2, c_done):
                problem = f"call {c_done} returned with items {s2['hits']}"
            problem = problem or bad_hits(s2)
            if problem:
                return Violation(problem, trace(state, step)), len(parent)
            nxt = _canonical(s2, c2, ws2)
            if nxt not in parent:
                if len(parent) >= max_states:
                    raise RuntimeError(f"more than {max_states} states")
                parent[nxt] = (state, step)
                stack.append(nxt)
    return None, len(parent)
