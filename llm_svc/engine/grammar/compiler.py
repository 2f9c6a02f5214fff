"""Checks constraints and compiles them with xgrammar on a small thread pool, once each.

Compilation never runs on the engine thread: `submit` returns a future at once, shared by
every request with the same constraint (the cache is keyed by `Constraint.key`, bounded
LRU; a constraint that failed to compile stays cached as failed, so a repeat fails fast).
A compile cannot be interrupted, so a slow one is bounded from outside: the request waiting
on it gives up at its deadline (`GrammarLimits.compile_timeout_s`), and the size and depth
limits keep such inputs rare.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import threading
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from iris.json_depth import json_depth
from llm_svc.engine.errors import InvalidRequestError
from llm_svc.engine.grammar.spec import Constraint, ConstraintKind

FIELD = "constraint"  # the name the engine's errors give the field (the gateway maps it)
_MESSAGE_CHARS = 300  # of xgrammar's error message, in ours
_JSON_KINDS = (ConstraintKind.JSON_SCHEMA, ConstraintKind.STRUCTURAL_TAG)
_ANY_OBJECT = '{"type": "object"}'
# xgrammar 0.2.9 lets two kinds of bytes into JSON strings that are not JSON: raw control
# characters in length-bounded strings ([^"\\\r\n]), and UTF-8-encoded surrogates
# (ED A0 80 ...) everywhere. Its JSON grammars' string classes are swapped for strict ones.
_SURROGATES = "\\uD800-\\uDFFF"
_STRICT_STRING_CLASSES = {
    '[^\\"\\\\\\r\\n]': f'[^\\"\\\\\\0-\\x1f{_SURROGATES}]',
    '[^\\0-\\x1f\\"\\\\\\r\\n]': f'[^\\0-\\x1f\\"\\\\\\r\\n{_SURROGATES}]',
    '[^\\"\\\\\\0-\\x1f]': f'[^\\"\\\\\\0-\\x1f{_SURROGATES}]',
}


@dataclass(frozen=True)
class GrammarLimits:
    """Bounds on one constraint: its text's size, its JSON nesting depth, its compile time."""

    max_bytes: int = 64 << 10
    max_depth: int = 32
    compile_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_depth"):
            if getattr(self, name) < 1:
                raise ValueError(f"grammar {name} must be >= 1, got {getattr(self, name)}")
        if not self.compile_timeout_s > 0:
            raise ValueError(f"grammar compile_timeout_s must be > 0, got {self.compile_timeout_s}")


def check_constraint(constraint: Constraint, limits: GrammarLimits) -> None:
    """Raise InvalidRequestError if the constraint is too large, too deep or not JSON
    where JSON is due. (Whether xgrammar can compile it is known only once compiled.)"""
    name = constraint.describe()
    size = len(constraint.value.encode())
    if size > limits.max_bytes:
        raise InvalidRequestError(FIELD, name, f"must be at most {limits.max_bytes} bytes")
    if constraint.kind in _JSON_KINDS:
        try:
            document = json.loads(constraint.value)
        except RecursionError:
            raise InvalidRequestError(
                FIELD, name, f"nests deeper than the limit of {limits.max_depth} levels"
            ) from None
        except ValueError as err:
            raise InvalidRequestError(FIELD, name, f"is not valid JSON: {err}") from None
        if not isinstance(document, dict):
            raise InvalidRequestError(FIELD, name, "must be a JSON object")
        depth = json_depth(document)
        if depth > limits.max_depth:
            raise InvalidRequestError(
                FIELD, name, f"nests {depth} levels deep, over the limit of {limits.max_depth}"
            )
    elif constraint.kind is not ConstraintKind.JSON_OBJECT and not constraint.value:
        raise InvalidRequestError(FIELD, name, "must not be empty")


class GrammarCompilerPool:
    """Compiles constraints for one tokenizer / vocabulary. xgrammar's tokenizer info is
    built on the pool's thread with the first constraint (it reads the whole vocabulary).

    `stop_token_ids` are the tokens that end a constrained request (the engine's EOS set):
    the grammar allows them once its text is complete."""

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        stop_token_ids: Iterable[int],
        limits: GrammarLimits,
        threads: int = 2,
        cache_entries: int = 256,
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.stop_token_ids = sorted(set(stop_token_ids))
        self.limits = limits
        self.cache_entries = cache_entries
        self._pool = cf.ThreadPoolExecutor(max(1, threads), thread_name_prefix="grammar-compile")
        self._cache: OrderedDict[str, cf.Future] = OrderedDict()
        self._lock = threading.Lock()  # the cache (the engine thread takes it too)
        self._compiler_lock = threading.Lock()
        self._compiler = None
        self.num_compiled = 0  # compiles started (cache misses), for tests and metrics

    def check(self, constraint: Constraint) -> None:
        check_constraint(constraint, self.limits)

    def submit(self, constraint: Constraint) -> cf.Future:
        """The compiled grammar's future (xgrammar.CompiledGrammar, or InvalidRequestError)."""
        key = constraint.key
        with self._lock:
            future = self._cache.get(key)
            if future is not None:
                self._cache.move_to_end(key)
                return future
            future = self._pool.submit(self._compile, constraint)
            self.num_compiled += 1
            self._cache[key] = future
            while len(self._cache) > self.cache_entries:
                self._cache.popitem(last=False)
            return future

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # --- pool threads ------------------------------------------------------------------
    def _compile(self, constraint: Constraint):
        import xgrammar

        compiler = self._compiler_once()
        kind, value = constraint.kind, constraint.value
        try:
            if kind is ConstraintKind.REGEX:
                return compiler.compile_regex(value)
            if kind is ConstraintKind.EBNF:
                return compiler.compile_grammar(value)
            if kind is ConstraintKind.STRUCTURAL_TAG:
                grammar = xgrammar.Grammar.from_structural_tag(value)
            else:
                # Compact JSON: with free whitespace a model could emit blanks forever.
                schema = value if kind is ConstraintKind.JSON_SCHEMA else _ANY_OBJECT
                grammar = xgrammar.Grammar.from_json_schema(schema, any_whitespace=False)
            return compiler.compile_grammar(_json_strings(grammar))
        except Exception as err:  # xgrammar's RuntimeError / InvalidJSONError / ValueError
            message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise InvalidRequestError(
                FIELD, constraint.describe(), f"cannot be compiled: {message[:_MESSAGE_CHARS]}"
            ) from None

    def _compiler_once(self):
        """xgrammar's compiler, built on first use (on a pool thread)."""
        with self._compiler_lock:
            if self._compiler is None:
                import xgrammar

                info = xgrammar.TokenizerInfo.from_huggingface(
                    self.tokenizer, vocab_size=self.vocab_size, stop_token_ids=self.stop_token_ids
                )
                self._compiler = xgrammar.GrammarCompiler(info, max_threads=1)
            return self._compiler


def _json_strings(grammar):
    """`grammar` with JSON strings that hold neither raw control characters nor encoded
    surrogates (both would make the output invalid JSON / invalid UTF-8)."""
    import xgrammar

    text = str(grammar)
    patched = text
    for loose, strict in _STRICT_STRING_CLASSES.items():
        patched = patched.replace(loose, strict)
    if patched == text:
        return grammar
    return xgrammar.Grammar.from_ebnf(patched)
