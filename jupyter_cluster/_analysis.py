"""Static analysis of a ``%%remote`` cell before its source goes to the cluster.

The kernel needs to know which notebook names a cell reads before assigning them (its
inputs, shipped to the cluster), which module-level names it binds (its outputs, brought
back), and whether its last statement is an expression to display like ``Out[n]``. This is
worked out from the cell's ``ast`` by walking its statements in source order with Python's
scoping rules (module, class, function and comprehension scopes), without running anything.
Cells that use IPython-only syntax such as ``%magic`` or ``!shell`` are refused with a
message that says which line to move to an ordinary cell.
"""

from __future__ import annotations

import ast
import functools
import io
import tokenize
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

from IPython.core.inputtransformer2 import TransformerManager

__all__ = ["CellAnalysis", "CellSyntaxError", "analyse_cell", "check_remote_syntax"]

_FILENAME = "<remote cell>"

# IPython leaves TransformerManager.__init__ unannotated; this keeps mypy --strict quiet.
_new_transformer: Callable[[], TransformerManager] = TransformerManager


@dataclass(frozen=True)
class CellAnalysis:
    """What a cell reads, binds and displays; see :func:`analyse_cell`."""

    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    displays_last: bool
    #: Top-level modules the cell imports, anywhere in it (absolute imports only).
    imports: tuple[str, ...] = ()


class CellSyntaxError(SyntaxError):
    """A ``%%remote`` cell that cannot be compiled as plain Python on the cluster."""

    def __str__(self) -> str:
        # The message already names the line; SyntaxError's default would repeat it.
        return str(self.msg)


def check_remote_syntax(source: str) -> None:
    """Check that a cell is plain Python that the cluster can compile.

    Parameters
    ----------
    source : str
        The cell's source, without the ``%%remote`` line.

    Raises
    ------
    CellSyntaxError
        If the source uses IPython-only syntax (``%magic``, ``!shell``, ``x?``, ``%%magic``),
        or is otherwise not valid Python. ``lineno``, ``offset`` and ``text`` locate the
        problem.
    """
    _parse(source)


def _parse(source: str) -> ast.Module:
    try:
        return ast.parse(source, _FILENAME)
    except SyntaxError as exc:
        lineno = _ipython_line(source, exc)
        if lineno is not None:
            text = source.splitlines()[lineno - 1]
            message = (
                f"line {lineno} uses IPython syntax (`{text.strip()}`), which cannot run on"
                " the cluster: run it in an ordinary cell, or use Python (e.g. subprocess)"
                " instead"
            )
            offset = len(text) - len(text.lstrip()) + 1
            raise CellSyntaxError(message, (_FILENAME, lineno, offset, text + "\n")) from None
        where = f", line {exc.lineno}" if exc.lineno is not None else ""
        message = f"invalid syntax in the remote cell{where}: {exc.msg}"
        position = (exc.lineno, exc.offset, exc.text, exc.end_lineno, exc.end_offset)
        raise CellSyntaxError(message, (_FILENAME, *position)) from None


def _ipython_line(source: str, error: SyntaxError) -> int | None:
    """Return the first line IPython's transformer rewrites, if that explains ``error``."""
    manager = _new_transformer()
    # Dedenting and prompt stripping are not IPython-only syntax: the cluster compiles the
    # raw source, so such cells must get the plain syntax error instead.
    manager.cleanup_transforms = []
    try:
        transformed = manager.transform_cell(source)
    except Exception:  # a transformer bug must not hide the real syntax error
        return None
    old, new = source.splitlines(), transformed.splitlines()
    if old == new:
        return None
    first = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
    lineno = min(first + 1, len(old))
    try:
        ast.parse(transformed, _FILENAME)
    except SyntaxError:
        # Still broken after the rewrite: blame IPython syntax only where Python failed.
        return lineno if error.lineno == lineno else None
    return lineno


@functools.lru_cache(maxsize=512)  # a pure function of the source: re-run cells are not re-parsed
def analyse_cell(source: str) -> CellAnalysis:
    """Find a cell's inputs and outputs, and whether it displays its last value.

    Parameters
    ----------
    source : str
        The cell's source, without the ``%%remote`` line.

    Returns
    -------
    CellAnalysis
        ``inputs``: names read at module level (or free in a function, as of its ``def``)
        before the cell binds them, in order of first read; builtins are included.
        ``outputs``: module-level names the cell binds or mutates through an attribute or
        subscript assignment, in order of first binding. ``displays_last``: the last
        top-level statement is an expression and the cell does not end with ``;``.

    Raises
    ------
    CellSyntaxError
        As :func:`check_remote_syntax`.
    """
    tree = _parse(source)
    displays = bool(tree.body) and isinstance(tree.body[-1], ast.Expr) and not _ends_quiet(source)
    imports = tuple(dict.fromkeys(_imported(tree)))
    walker = _Walker()
    try:
        for statement in tree.body:
            walker.visit(statement)
    except RecursionError:
        # Python compiles deeper expressions than this walker can recurse into: fall back to
        # every name read and every name stored, which over-approximates both answers.
        found = sorted(
            (node for node in ast.walk(tree) if isinstance(node, ast.Name)),
            key=lambda node: (node.lineno, node.col_offset),
        )
        inputs = dict.fromkeys(n.id for n in found if isinstance(n.ctx, ast.Load | ast.Del))
        outputs = dict.fromkeys(n.id for n in found if isinstance(n.ctx, ast.Store))
        return CellAnalysis(tuple(inputs), tuple(outputs), displays, imports)
    return CellAnalysis(tuple(walker.inputs), tuple(walker.outputs), displays, imports)


def _imported(tree: ast.Module) -> Iterator[str]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name.split(".", 1)[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module.split(".", 1)[0]


def _ends_quiet(source: str) -> bool:
    """Tell whether the last token, ignoring comments and whitespace, is ``;`` (IPython's rule)."""
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT}
    last = ""
    try:
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type not in skip and token.type != tokenize.ENDMARKER:
                last = token.string
    except (tokenize.TokenError, SyntaxError):
        return source.rstrip().endswith(";")
    return last == ";"


def _parameters(args: ast.arguments) -> list[ast.arg]:
    named = [*args.posonlyargs, *args.args, *args.kwonlyargs]
    return named + [arg for arg in (args.vararg, args.kwarg) if arg is not None]


def _class_header(node: ast.ClassDef) -> list[ast.expr]:
    """Return what a class statement evaluates before its body: decorators, bases, keywords."""
    return [*node.decorator_list, *node.bases, *(keyword.value for keyword in node.keywords)]


@dataclass
class _Scope:
    kind: Literal["module", "class", "function", "comprehension"]
    parent: _Scope | None = None
    # Module and class scopes grow as statements run; function and comprehension scopes
    # hold all their locals from the start, as Python decides them at compile time.
    bound: set[str] = field(default_factory=set)
    globals_: set[str] = field(default_factory=set)
    nonlocals: set[str] = field(default_factory=set)
    # Whether the code runs as the cell runs (module, class bodies), not when called later.
    immediate: bool = True


_Function = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
_Comprehension = ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp


def _own_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """Yield ``node`` and the nodes under it that run in its scope, parents first."""
    yield node
    children: Iterable[ast.AST | None]
    if isinstance(node, _Function):
        # Only what is evaluated where the function is defined: the body is another scope.
        decorators = getattr(node, "decorator_list", [])
        children = [*decorators, *node.args.defaults, *node.args.kw_defaults]
    elif isinstance(node, ast.ClassDef):
        children = _class_header(node)
    else:
        children = ast.iter_child_nodes(node)
    for child in children:
        if child is not None:
            yield from _own_nodes(child)


def _declared(body: Sequence[ast.AST]) -> tuple[set[str], set[str], set[str]]:
    """Return the names a scope's body binds, declares ``global`` and declares ``nonlocal``."""
    names: set[str] = set()
    globals_: set[str] = set()
    nonlocals: set[str] = set()
    loop_variables: set[int] = set()
    for node in (node for statement in body for node in _own_nodes(statement)):
        if isinstance(node, ast.comprehension):
            # Comprehension variables are the comprehension's own; walrus targets are not.
            loop_variables.update(id(name) for name in ast.walk(node.target))
        elif isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            if id(node) not in loop_variables:
                names.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.alias) and node.name != "*":
            names.add(node.asname or node.name.split(".")[0])
        elif isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.MatchMapping) and node.rest:
            names.add(node.rest)
        elif isinstance(node, ast.Global):
            globals_.update(node.names)
        elif isinstance(node, ast.Nonlocal):
            nonlocals.update(node.names)
    return names, globals_, nonlocals


class _Walker(ast.NodeVisitor):
    """Walk a cell's statements in order, recording module-level reads and bindings."""

    def __init__(self) -> None:
        self.module = _Scope("module")
        self.scope = self.module
        self.inputs: dict[str, None] = {}
        self.outputs: dict[str, None] = {}
        self.lazy_annotations = False
        # Method bodies wait until their class is bound, since they run only after that.
        self.pending: list[tuple[_Scope, list[ast.stmt]]] = []

    def _is_global(self, name: str) -> bool:
        scope: _Scope | None = self.scope
        first = True
        while scope is not None and scope.kind != "module":
            # Class-level names are visible only to the class body itself, not to nested scopes.
            if first or scope.kind != "class":
                if name in scope.globals_:
                    return True
                if name in scope.bound:
                    return False
            scope, first = scope.parent, False
        return True

    def _load(self, name: str) -> None:
        if self._is_global(name) and name not in self.module.bound:
            self.inputs.setdefault(name)

    def _store(self, name: str, scope: _Scope | None = None) -> None:
        scope = scope or self.scope
        if scope.kind == "module" or name in scope.globals_:
            self.outputs.setdefault(name)
            # A function may never be called, so its global stores leave later reads inputs.
            if scope.immediate:
                self.module.bound.add(name)
        elif scope.kind == "class" and name not in scope.nonlocals:
            scope.bound.add(name)

    def _delete(self, name: str) -> None:
        scope = self.scope
        if scope.kind == "module" or name in scope.globals_:
            self._load(name)  # it must exist to be deleted
            if scope.immediate:
                self.module.bound.discard(name)
                self.outputs.pop(name, None)
        elif scope.kind == "class":
            scope.bound.discard(name)

    def _mutate(self, target: ast.Attribute | ast.Subscript) -> None:
        self.visit(target.value)
        if isinstance(target, ast.Subscript):
            self.visit(target.slice)
        base: ast.expr = target
        while isinstance(base, ast.Attribute | ast.Subscript):
            base = base.value
        if isinstance(base, ast.Name) and self._is_global(base.id):
            self.outputs.setdefault(base.id)

    def _walk(self, scope: _Scope, nodes: Sequence[ast.AST]) -> None:
        outer, self.scope = self.scope, scope
        for node in nodes:
            self.visit(node)
        self.scope = outer

    def _branches(self, branches: Sequence[Sequence[ast.AST]]) -> None:
        """Walk mutually exclusive branches, each seeing only the bindings made before it."""
        scope, outputs = self.scope, list(self.outputs)
        before, added, removed = set(scope.bound), set[str](), set[str]()
        for branch in branches:
            if scope.kind in ("module", "class"):
                scope.bound = set(before)
            self._walk(scope, branch)
            added |= scope.bound - before
            removed |= before - scope.bound
        if scope.kind in ("module", "class"):
            scope.bound = (before - removed) | added
        # A name deleted in one branch still exists after another, so it stays an output.
        self.outputs = dict.fromkeys([*outputs, *self.outputs])

    def _function_scope(self, args: ast.arguments, body: Sequence[ast.AST]) -> _Scope:
        names, globals_, nonlocals = _declared(body)
        bound = ({arg.arg for arg in _parameters(args)} | names) - globals_ - nonlocals
        return _Scope("function", self.scope, bound, globals_, nonlocals, immediate=False)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load):
            self._load(node.id)
        elif isinstance(node.ctx, ast.Del):
            self._delete(node.id)
        else:
            self._store(node.id)

    def _visit_member(self, node: ast.Attribute | ast.Subscript) -> None:
        if isinstance(node.ctx, ast.Load):
            self.generic_visit(node)
        else:
            self._mutate(node)

    visit_Attribute = visit_Subscript = _visit_member

    def visit_NamedExpr(self, node: ast.NamedExpr) -> None:
        self.visit(node.value)
        scope = self.scope
        while scope.kind == "comprehension" and scope.parent is not None:
            scope = scope.parent
        self._store(node.target.id, scope)

    def visit_Lambda(self, node: ast.Lambda) -> None:
        for expr in (*node.args.defaults, *node.args.kw_defaults):
            if expr is not None:
                self.visit(expr)
        self._walk(self._function_scope(node.args, [node.body]), [node.body])

    def _visit_comprehension(self, node: _Comprehension) -> None:
        # The first iterable is evaluated in the enclosing scope, the rest in the new one.
        self.visit(node.generators[0].iter)
        names = {
            name.id
            for generator in node.generators
            for name in ast.walk(generator.target)
            if isinstance(name, ast.Name) and isinstance(name.ctx, ast.Store)
        }
        outer = self.scope
        self.scope = _Scope("comprehension", outer, names, immediate=outer.immediate)
        for index, generator in enumerate(node.generators):
            if index:
                self.visit(generator.iter)
            self.visit(generator.target)
            for condition in generator.ifs:
                self.visit(condition)
        elements = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
        for element in elements:
            self.visit(element)
        self.scope = outer

    visit_ListComp = visit_SetComp = visit_GeneratorExp = visit_DictComp = _visit_comprehension

    def _visit_function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        args = node.args
        evaluated = [*node.decorator_list, *args.defaults, *args.kw_defaults]
        if not self.lazy_annotations:
            evaluated += [*(arg.annotation for arg in _parameters(args)), node.returns]
        for expr in evaluated:
            if expr is not None:
                self.visit(expr)
        # Bound before the body is walked, so that recursion does not make it an input.
        self._store(node.name)
        scope = self._function_scope(args, node.body)
        if self.scope.kind == "class":
            self.pending.append((scope, node.body))
        else:
            self._walk(scope, node.body)

    visit_FunctionDef = visit_AsyncFunctionDef = _visit_function

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for expr in _class_header(node):
            self.visit(expr)
        _, globals_, nonlocals = _declared(node.body)
        scope = _Scope("class", self.scope, set(), globals_, nonlocals, self.scope.immediate)
        outer_pending, self.pending = self.pending, []
        self._walk(scope, node.body)
        self._store(node.name)
        pending, self.pending = self.pending, outer_pending
        if self.scope.kind == "class":
            self.pending.extend(pending)
        else:
            for method_scope, body in pending:
                self._walk(method_scope, body)

    def visit_Assign(self, node: ast.Assign) -> None:
        self.visit(node.value)
        for target in node.targets:
            self.visit(target)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        if isinstance(node.target, ast.Name):
            self._load(node.target.id)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)
            self.visit(node.target)
        elif not isinstance(node.target, ast.Name):
            self.visit(node.target.value)
        # Annotations of local variables are never evaluated; module and class ones are.
        if self.scope.kind in ("module", "class") and not self.lazy_annotations:
            self.visit(node.annotation)

    def _visit_for(self, node: ast.For | ast.AsyncFor) -> None:
        for child in (node.iter, node.target, *node.body, *node.orelse):
            self.visit(child)

    visit_For = visit_AsyncFor = _visit_for

    def visit_If(self, node: ast.If) -> None:
        self.visit(node.test)
        self._branches([node.body, node.orelse])

    def visit_Match(self, node: ast.Match) -> None:
        self.visit(node.subject)
        self._branches([*([case] for case in node.cases), []])

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module == "__future__":
            # A compiler directive, not a value worth bringing back.
            self.lazy_annotations |= any(a.name == "annotations" for a in node.names)
        else:
            self.generic_visit(node)

    def visit_alias(self, node: ast.alias) -> None:
        if node.name != "*":
            self._store(node.asname or node.name.split(".")[0])

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.type is not None:
            self.visit(node.type)
        if node.name is None:
            self._walk(self.scope, node.body)
            return
        # Python deletes the name when the handler ends: it is bound only inside, never output.
        scope, name = self.scope, node.name
        was_bound, was_output = name in scope.bound, name in self.outputs
        if scope.kind in ("module", "class"):
            scope.bound.add(name)
        self._walk(scope, node.body)
        if not was_bound:
            scope.bound.discard(name)
        if not was_output:
            self.outputs.pop(name, None)

    def _visit_pattern(self, node: ast.MatchAs | ast.MatchStar | ast.MatchMapping) -> None:
        self.generic_visit(node)
        name = node.rest if isinstance(node, ast.MatchMapping) else node.name
        if name:
            self._store(name)

    visit_MatchAs = visit_MatchStar = visit_MatchMapping = _visit_pattern
