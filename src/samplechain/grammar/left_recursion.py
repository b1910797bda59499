"""Left recursion in a compiled grammar's rules is refused before any stack is expanded (llama.cpp's
``llama_grammar_detect_left_recursion``):
a left cycle that grows the stack would expand forever."""

from __future__ import annotations

from samplechain.grammar.parser import ALT, END, RULE_REF, Element, GrammarError, ParsedGrammar


def check_left_recursion(parsed: ParsedGrammar) -> None:
    """Refuse left recursion: llama.cpp's check, plus any left cycle that grows the stack.

    llama.cpp only treats rules with an empty alternative of their own as nullable, so recursion through an
    indirectly nullable rule escapes it and then expands forever. With the full nullable fixpoint, a
    left cycle is harmless only when every step is a tail call (the stack returns to an identical state,
    e.g. ``( [x]* )*``); a cycle that leaves a continuation behind grows without end and is refused.
    """
    rules, n = parsed.rules, len(parsed.rules)

    def alternatives(rule: list[Element]) -> list[list[Element]]:
        alts, cur = [], []
        for e in rule:
            if e[0] in (ALT, END):
                alts.append(cur)
                cur = []
            else:
                cur.append(e)
        return alts

    alts = [alternatives(r) for r in rules]
    for r in rules:
        for t, v in r:
            if t == RULE_REF and v >= n:
                raise GrammarError(f"rule reference #{v} does not exist")
    # llama.cpp's check ("may be empty" = has an empty alternative)
    may_be_empty = [any(not a for a in alts[i]) for i in range(n)]
    visited, in_progress = [False] * n, [False] * n

    def llama_detect(i: int) -> int | None:
        stack = [(i, 0, 0)]  # iterative DFS over (rule, alternative, element)
        in_progress[i] = True
        while stack:
            r, a, e = stack.pop()
            if a >= len(alts[r]):
                in_progress[r] = False
                visited[r] = True
                continue
            alt = alts[r][a]
            if e >= len(alt) or alt[e][0] != RULE_REF:
                stack.append((r, a + 1, 0))
                continue
            child = alt[e][1]
            resume = (r, a, e + 1) if may_be_empty[child] else (r, a + 1, 0)
            if in_progress[child]:
                return child
            stack.append(resume)
            if not visited[child]:
                in_progress[child] = True
                stack.append((child, 0, 0))
        return None

    for i in range(n):
        if not visited[i] and (hit := llama_detect(i)) is not None:
            raise GrammarError(f"left recursion detected in rule '{parsed.name_of(hit)}'")
    # full nullable fixpoint, then left edges labelled "grows" when a continuation stays on the stack
    nullable = [False] * n
    changed = True
    while changed:
        changed = False
        for i in range(n):
            if not nullable[i] and any(all(t == RULE_REF and nullable[v] for t, v in a) for a in alts[i]):
                nullable[i] = changed = True
    edges: list[list[tuple[int, bool]]] = [[] for _ in range(n)]
    for i in range(n):
        for a in alts[i]:
            for k, (t, v) in enumerate(a):
                if t != RULE_REF:
                    break
                edges[i].append((v, k + 1 < len(a)))
                if not nullable[v]:
                    break
    comp = _strongly_connected(n, [[v for v, _ in es] for es in edges])
    for i in range(n):
        for v, grows in edges[i]:
            if grows and comp[v] == comp[i]:
                raise GrammarError(f"left recursion detected in rule '{parsed.name_of(i)}'")


def _strongly_connected(n: int, adj: list[list[int]]) -> list[int]:
    """Component id of every node (iterative Tarjan)."""
    index, low, comp = [-1] * n, [0] * n, [-1] * n
    on_stack = [False] * n
    stack: list[int] = []
    counter = n_comp = 0
    for root in range(n):
        if index[root] >= 0:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = counter
                counter += 1
                stack.append(v)
                on_stack[v] = True
            if i < len(adj[v]):
                work.append((v, i + 1))
                w = adj[v][i]
                if index[w] < 0:
                    work.append((w, 0))
                elif on_stack[w]:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                while True:
                    w = stack.pop()
                    on_stack[w] = False
                    comp[w] = n_comp
                    if w == v:
                        break
                n_comp += 1
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return comp
