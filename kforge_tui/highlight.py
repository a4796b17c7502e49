"""CUDA source highlighting: tree-sitter-cuda when installed, else Pygments' `cuda` lexer."""

from __future__ import annotations

import difflib
from functools import lru_cache

from rich.syntax import Syntax
from rich.text import Text

# The grammar package ships only the CUDA additions ("; inherits: cpp"); these are the C/C++ basics.
_BASE_QUERY = """
(comment) @comment
(string_literal) @string
(char_literal) @string
(system_lib_string) @string
(number_literal) @number
(primitive_type) @type
(type_identifier) @type
(sized_type_specifier) @type
(preproc_include) @keyword
(preproc_def) @keyword
(function_declarator declarator: (identifier) @function)
(call_expression function: (identifier) @function)
(field_identifier) @property
["if" "else" "for" "while" "do" "return" "break" "continue" "switch" "case" "default"
 "const" "static" "struct" "extern" "inline" "typedef" "sizeof" "template" "typename"] @keyword
"""
_STYLES = {
    "comment": "italic #7f848e", "string": "#98c379", "number": "#d19a66", "type": "#e5c07b",
    "keyword": "bold #c678dd", "function": "#61afef", "property": "#56b6c2", "punctuation": "#abb2bf",
}


@lru_cache(maxsize=1)
def _tree_sitter():
    """(parser, query) for CUDA, or None when tree-sitter-cuda is not usable here."""
    try:
        from pathlib import Path

        import tree_sitter
        import tree_sitter_cuda

        lang = tree_sitter.Language(tree_sitter_cuda.language())
        extra = Path(tree_sitter_cuda.__file__).parent / "queries" / "highlights.scm"
        text = _BASE_QUERY + (extra.read_text() if extra.is_file() else "")
        try:
            query = tree_sitter.Query(lang, text)
        except Exception:  # a grammar/query version skew: keep the basics
            query = tree_sitter.Query(lang, _BASE_QUERY)
        return tree_sitter.Parser(lang), query, tree_sitter
    except Exception:
        return None


def highlighter_name() -> str:
    """'tree-sitter-cuda' or 'pygments' (shown in the detail screen so the fallback is visible)."""
    return "tree-sitter-cuda" if _tree_sitter() else "pygments"


def highlight_cuda(source: str) -> Text:
    """The source as styled rich Text with line numbers left to the caller."""
    ts = _tree_sitter()
    if ts is None:
        return Syntax(source, "cuda", theme="monokai", background_color="default").highlight(source)
    parser, query, mod = ts
    data = source.encode()
    tree = parser.parse(data)
    text = Text(source)
    # Byte offsets -> character offsets (sources may hold non-ASCII in comments).
    char_at = _byte_to_char(source)
    captures = mod.QueryCursor(query).captures(tree.root_node)
    for name, nodes in captures.items():
        style = _STYLES.get(name.split(".")[0])
        if not style:
            continue
        for node in nodes:
            text.stylize(style, char_at(node.start_byte), char_at(node.end_byte))
    return text


def _byte_to_char(source: str):
    if source.isascii():
        return lambda b: b
    offsets = []
    for i, ch in enumerate(source):
        offsets.extend([i] * len(ch.encode()))
    offsets.append(len(source))
    return lambda b: offsets[min(b, len(offsets) - 1)]


def diff_text(parent: str | None, source: str) -> Text:
    """A unified diff of the parent's source against this one, coloured."""
    if parent is None:
        return Text("(no parent: this candidate was proposed from scratch)", style="italic")
    lines = list(difflib.unified_diff(parent.splitlines(), source.splitlines(), "parent", "this", lineterm=""))
    if not lines:
        return Text("(identical source to the parent; only the launch spec differs)", style="italic")
    out = Text()
    for line in lines:
        style = ("bold" if line.startswith(("---", "+++")) else "green" if line.startswith("+")
                 else "red" if line.startswith("-") else "cyan" if line.startswith("@@") else "")
        out.append(line + "\n", style=style)
    return out
