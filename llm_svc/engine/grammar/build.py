"""Compiles one constraint with xgrammar: what a compile worker process runs
(llm_svc/engine/grammar/worker.py), never the engine's own process."""

from __future__ import annotations

from llm_svc.engine.grammar.spec import ConstraintKind

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


def compile_constraint(compiler, kind: ConstraintKind, value: str):
    """xgrammar's CompiledGrammar for (kind, value); raises xgrammar's error if it cannot."""
    import xgrammar

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
