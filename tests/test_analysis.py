"""Unit tests for jupyter_cluster._analysis: a cell's inputs, outputs and syntax checks."""

from __future__ import annotations

import pickle
import textwrap

import pytest

from jupyter_cluster._analysis import (
    CellAnalysis,
    CellSyntaxError,
    analyse_cell,
    check_remote_syntax,
)


def names(source: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    analysis = analyse_cell(textwrap.dedent(source))
    return analysis.inputs, analysis.outputs


CASES = {
    "read before binding is an input": (
        """
        y = x + 1
        z = y
        """,
        ("x",),
        ("y", "z"),
    ),
    "inputs in order of first read": (
        """
        total = b + a + b
        """,
        ("b", "a"),
        ("total",),
    ),
    "self-referencing assignment": ("x = x + 1", ("x",), ("x",)),
    "augmented assignment": ("x += 1", ("x",), ("x",)),
    "augmented assignment after binding": (
        """
        x = 0
        x += step
        """,
        ("step",),
        ("x",),
    ),
    "annotated assignment": ("x: int = 1", ("int",), ("x",)),
    "bare annotation binds nothing": ("x: int", ("int",), ()),
    "unpacking targets": ("a, (b, *c) = [d] = data", ("data",), ("a", "b", "c", "d")),
    "attribute and subscript targets": (
        """
        d["k"] = v
        obj.a = 2
        e["k"] += 1
        """,
        ("v", "d", "obj", "e"),
        ("d", "obj", "e"),
    ),
    "nested attribute target": ("cfg.opts[i].x = 1", ("cfg", "i"), ("cfg",)),
    "subscript target of a name bound in the cell": (
        """
        d = {}
        d["k"] = 1
        """,
        (),
        ("d",),
    ),
    "for target": (
        """
        for i, x in enumerate(xs):
            total = x
        """,
        ("enumerate", "xs"),
        ("i", "x", "total"),
    ),
    "with target": (
        """
        with open(path) as f:
            text = f.read()
        """,
        ("open", "path"),
        ("f", "text"),
    ),
    "imports": (
        """
        import a.b
        import a.b as c
        from m import x as y
        from n import *
        from . import rel
        """,
        (),
        ("a", "c", "y", "rel"),
    ),
    "function definition reads decorators, defaults and annotations": (
        """
        @deco(level)
        def f(x, y=default, *, z=kw) -> Ret:
            return x + y + z + free
        """,
        ("deco", "level", "default", "kw", "Ret", "free"),
        ("f",),
    ),
    "free name bound before the def is not an input": (
        """
        scale = 2
        def f(x):
            return x * scale
        y = f(1)
        """,
        (),
        ("scale", "f", "y"),
    ),
    "free name bound after the def is an input": (
        """
        def f():
            return later
        later = 1
        """,
        ("later",),
        ("f", "later"),
    ),
    "recursive function": (
        """
        def fact(n):
            return 1 if n < 2 else n * fact(n - 1)
        """,
        (),
        ("fact",),
    ),
    "function locals and parameters": (
        """
        def f(a, /, b, *args, c, **kw):
            tmp = a
            for i in args:
                tmp += i
            import os
            return tmp, os, b, c, kw
        """,
        (),
        ("f",),
    ),
    "name assigned anywhere in a function is local": (
        """
        def f():
            print(x)
            x = 1
        """,
        ("print",),
        ("f",),
    ),
    "lambda": ("g = lambda a, b=default: a + b + offset", ("default", "offset"), ("g",)),
    "global assignment in a function": (
        """
        def init():
            global state
            state = {}
        """,
        (),
        ("init", "state"),
    ),
    "global augmented assignment in a function": (
        """
        def bump():
            global counter
            counter += 1
        """,
        ("counter",),
        ("bump", "counter"),
    ),
    "global assigned in a function does not bind the name for later reads": (
        """
        def init():
            global s
            s = 1
        init()
        print(s)
        """,
        ("print", "s"),
        ("init", "s"),
    ),
    "nonlocal refers to the enclosing function": (
        """
        def outer():
            count = 0
            def inner():
                nonlocal count
                count += 1
                return count + other
            return inner
        """,
        ("other",),
        ("outer",),
    ),
    "enclosing function locals are not inputs": (
        """
        def outer():
            x = 1
            def inner():
                return x + y
            return inner
        """,
        ("y",),
        ("outer",),
    ),
    "class body and methods": (
        """
        class A(Base, metaclass=Meta):
            size = DEFAULT
            double = size * 2
            def m(self):
                return size + A + helper
        """,
        ("Base", "Meta", "DEFAULT", "size", "helper"),
        ("A",),
    ),
    "class attribute target of an outer name": (
        """
        class A:
            registry["A"] = 1
        """,
        ("registry",),
        ("registry", "A"),
    ),
    "comprehension": (
        "result = [x * factor for x in data if x > limit]",
        ("data", "limit", "factor"),
        ("result",),
    ),
    "nested comprehension": (
        "pairs = {k: v for k, vs in groups.items() for v in vs}",
        ("groups",),
        ("pairs",),
    ),
    "comprehension variable does not leak": (
        """
        [i for i in range(3)]
        print(i)
        """,
        ("range", "print", "i"),
        (),
    ),
    "generator expression": ("total = sum(n for n in nums)", ("sum", "nums"), ("total",)),
    "comprehension in a class body does not see class names": (
        """
        class C:
            n = 2
            xs = [n * i for i in range(n)]
        """,
        ("range", "n"),
        ("C",),
    ),
    "walrus": ("if (n := len(items)) > 10:\n    pass", ("len", "items"), ("n",)),
    "walrus in a comprehension binds at module scope": (
        """
        vals = [y := f(x) for x in xs]
        print(y)
        """,
        ("xs", "f", "print"),
        ("y", "vals"),
    ),
    "walrus in a comprehension in a function is local": (
        """
        def f(xs):
            [y := x for x in xs]
            return y
        """,
        (),
        ("f",),
    ),
    "match captures": (
        """
        match command:
            case Point(x=a):
                pass
            case [first, *rest]:
                pass
            case {"k": v, **others}:
                pass
            case Color.RED:
                pass
            case _ as whole if whole:
                pass
            case _:
                pass
        """,
        ("command", "Point", "Color"),
        ("a", "first", "rest", "v", "others", "whole"),
    ),
    "except name bound before the handler stays an output": (
        """
        e = None
        try:
            run()
        except ValueError as e:
            pass
        """,
        ("run", "ValueError"),
        ("e",),
    ),
    "except name is not an output": (
        """
        try:
            run()
        except ValueError as e:
            msg = str(e)
        last = e
        """,
        ("run", "ValueError", "str", "e"),
        ("msg", "last"),
    ),
    "del of an unbound name is an input": ("del x", ("x",), ()),
    "del removes an output": ("x = 1\ndel x", (), ()),
    "read after del is an input": ("x = 1\ndel x\ny = x", ("x",), ("y",)),
    "bound again after del": ("x = 1\ndel x\nx = 2", (), ("x",)),
    "del of a subscript mutates the base": ('del d["k"]', ("d",), ("d",)),
    "binding in a branch counts": (
        """
        if flag:
            y = compute()
        print(y)
        """,
        ("flag", "compute", "print"),
        ("y",),
    ),
    "read before binding in a loop": (
        """
        while cond:
            total = total + step
        """,
        ("cond", "total", "step"),
        ("total",),
    ),
    "try body bindings count": (
        """
        try:
            value = load()
        finally:
            print(value)
        """,
        ("load", "print"),
        ("value",),
    ),
    "else branch does not see the if branch's bindings": (
        """
        if flag:
            y = 1
        else:
            z = y
        """,
        ("flag", "y"),
        ("y", "z"),
    ),
    "del in one branch keeps the output": (
        """
        x = 1
        if flag:
            del x
        print(x)
        """,
        ("flag", "print", "x"),
        ("x",),
    ),
    "future import binds nothing and defers annotations": (
        """
        from __future__ import annotations
        def f(x: Model) -> Result:
            return x
        y: Model = f(1)
        """,
        (),
        ("f", "y"),
    ),
    "builtins are not filtered": ("print(len(range(3)))", ("print", "len", "range"), ()),
}


@pytest.mark.parametrize(("source", "inputs", "outputs"), CASES.values(), ids=CASES.keys())
def test_inputs_and_outputs(source: str, inputs: tuple[str, ...], outputs: tuple[str, ...]) -> None:
    assert names(source) == (inputs, outputs)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("x = 1\nx", True),
        ("f(x)  # a call\n\n", True),
        ("x = 1\nx;", False),
        ("x;  # quiet\n  \n", False),
        ('x = "a;"\nx', True),
        ("x = 1", False),
        ("if x:\n    x", False),
        ("", False),
        ("# only a comment", False),
    ],
)
def test_displays_last(source: str, expected: bool) -> None:
    assert analyse_cell(source).displays_last is expected


def test_too_deep_for_the_walker_over_approximates() -> None:
    source = "a = 1\nb = " + "a + " * 2500 + "c\n"
    assert names(source) == (("a", "c"), ("a", "b"))


def test_analysis_is_a_frozen_value() -> None:
    analysis = analyse_cell("y = x")
    assert analysis == CellAnalysis(inputs=("x",), outputs=("y",), displays_last=False)
    with pytest.raises(AttributeError):
        analysis.inputs = ()  # type: ignore[misc]


def test_syntax_error_reports_its_line() -> None:
    source = "a = 1\nb = 2\nc = = 3\n"
    with pytest.raises(CellSyntaxError) as caught:
        analyse_cell(source)
    error = caught.value
    assert isinstance(error, SyntaxError)
    assert str(error) == "invalid syntax in the remote cell, line 3: invalid syntax"
    assert (error.lineno, error.offset, error.text) == (3, 5, "c = = 3\n")


def test_unclosed_bracket_reports_its_line() -> None:
    with pytest.raises(CellSyntaxError, match=r"line 2: '\(' was never closed"):
        check_remote_syntax("a = 1\nb = f(\n\nc = 2\n")


def test_leading_indentation_is_a_plain_syntax_error() -> None:
    message = "invalid syntax in the remote cell, line 1: unexpected indent"
    with pytest.raises(CellSyntaxError, match=message):
        check_remote_syntax("    x = 1\n    y = 2\n")


@pytest.mark.parametrize(
    ("source", "lineno", "text"),
    [
        ("!ls", 1, "!ls"),
        ("x = 1\n!ls -l\n", 2, "!ls -l"),
        ("x = 1\n%time y = 1\n", 2, "%time y = 1"),
        ("x?", 1, "x?"),
        ("files = !ls", 1, "files = !ls"),
        ("%%time\nx = 1\n", 1, "%%time"),
        ("if x:\n    %time y = 1\n", 2, "%time y = 1"),
    ],
)
def test_ipython_syntax_is_refused(source: str, lineno: int, text: str) -> None:
    with pytest.raises(CellSyntaxError) as caught:
        analyse_cell(source)
    error = caught.value
    assert str(error) == (
        f"line {lineno} uses IPython syntax (`{text}`), which cannot run on the cluster: "
        "run it in an ordinary cell, or use Python (e.g. subprocess) instead"
    )
    assert error.lineno == lineno
    assert error.text is not None and error.text.strip() == text


def test_ipython_syntax_with_another_error_reports_the_first_problem() -> None:
    with pytest.raises(CellSyntaxError, match="line 1 uses IPython syntax"):
        check_remote_syntax("!ls\nx = = 1\n")
    with pytest.raises(CellSyntaxError, match="invalid syntax in the remote cell, line 1"):
        check_remote_syntax("x = = 1\n!ls\n")


def test_percent_in_valid_code_is_not_refused() -> None:
    source = 's = "100%"\nprint("%d!" % 3)\nm = 7 % 2\n# !not a shell command\n'
    check_remote_syntax(source)
    assert names(source) == (("print",), ("s", "m"))


def test_cell_syntax_error_pickles() -> None:
    with pytest.raises(CellSyntaxError) as caught:
        check_remote_syntax("x = = 1")
    copy = pickle.loads(pickle.dumps(caught.value))
    assert isinstance(copy, CellSyntaxError)
    assert (str(copy), copy.lineno) == (str(caught.value), 1)
