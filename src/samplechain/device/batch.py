"""``BatchSampler``: one chain per row, the leading device-capable samplers of every chain run batched on torch.

A row's *device prefix* is the longest leading run of its chain's samplers whose device form handles the row's
shape at that point (:meth:`Sampler.device_plan`). Rows whose prefixes have the same key (sampler types and
static choices) form one group and run one *program*: each sampler once for the whole group, with per-row
parameter tensors built on the first step and kept while the batch composition lasts (``group.py``).

A step is a fixed sequence of tensor operations: the host draws each row's random numbers from the row's own
llama.cpp-exact generators and writes them into one static buffer; the device makes every decision, including
"redo this row on the CPU"; then ONE transfer brings back, per row, the token id (or the redo mark), and only what
the CPU needs besides: the reduced candidates of rows whose chain continues on the CPU, the final candidates of
narrow rows (so ``top_probs`` reports what a CPU step reports), the full logits of rows sampled on the CPU. On
CUDA the step is captured as a CUDA graph after its first run and replayed.

A row whose device decision lies within floating-point reach of a different outcome (see :mod:`samplechain.rows`)
is redone on the CPU from its logits with its generators rewound (this needs a second transfer, of those rows'
logits only): the token is always the one the row's CPU chain selects, whatever else shares the batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from samplechain.candidates import Candidates
from samplechain.chain import Chain
from samplechain.device.group import BatchGroup, BatchRow, plan_prefix
from samplechain.device.protocol import ChainRow, RowSampler
from samplechain.rows import Rows, block_max
from samplechain.samplers.base import SELECTOR, Sampler


class BatchSampler:
    """Sample one token per row of a ``[B, n_vocab]`` logits tensor, row i with ``chains[i]``.

    ``chains`` holds one :class:`Chain` or one row sampler (:class:`~samplechain.device.protocol.RowSampler`,
    e.g. ``CommonSampler``) per row, distinct objects: each keeps its own state. ``select_on_device=False`` stops
    every device prefix before its selector (llama.cpp's hybrid mode: filtering on the device, the draw on the
    CPU over the reduced candidates). A row whose sampler is ``cpu_only`` (a grammar) samples on the CPU
    (llama.cpp turns backend sampling off for grammars). On CUDA the step is captured as a graph at its second call
    and replayed (3.3x faster at 64 x 49k on an H200, the same tokens); ``cuda_graph=False`` launches it op by op.
    """

    def __init__(self, chains: Sequence[Chain | RowSampler], device: str | torch.device = "cpu", *,
                 select_on_device: bool = True, cuda_graph: bool = True) -> None:
        if isinstance(chains, (Chain, RowSampler)) or not isinstance(chains, Sequence):
            raise ValueError("chains must be a sequence with one Chain or CommonSampler per row")
        if not chains:
            raise ValueError("chains must not be empty")
        try:
            self.device = torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise ValueError(f"unknown device {device!r}") from e
        self.select_on_device = select_on_device
        seen: set[int] = set()
        self._rows: list[BatchRow] = []
        for i, owner in enumerate(chains):
            if isinstance(owner, Chain):
                row_sampler: RowSampler = ChainRow(owner)
            elif isinstance(owner, RowSampler):
                row_sampler = owner
            else:
                raise ValueError(f"chains[{i}] must be a Chain or CommonSampler, got {type(owner).__name__}")
            if id(owner) in seen:
                raise ValueError(f"chains[{i}] appears twice; every row needs its own chain (clone() it)")
            seen.add(id(owner))
            row = BatchRow(row_sampler, list(row_sampler.samplers), 0, (), bool(row_sampler.cpu_only))
            if not row.cpu_only:
                row.prefix, row.key = plan_prefix(row.samplers, select_on_device)
            row.seeded = [s for s in row.samplers if hasattr(s, "rng")]
            self._rows.append(row)
        by_key: dict[tuple, list[int]] = {}
        for i, row in enumerate(self._rows):
            if row.key:
                by_key.setdefault(row.key, []).append(i)
        self._groups: list[BatchGroup] = []
        for idx in by_key.values():
            members = [[s for s in self._rows[i].samplers[: self._rows[i].prefix] if not s.disabled] for i in idx]
            whole = idx == list(range(len(self._rows)))
            index = None if whole else torch.tensor(idx, dtype=torch.int64, device=self.device)
            records = any(not isinstance(self._rows[i].owner, ChainRow) for i in idx)
            self._groups.append(BatchGroup(idx, [list(slot) for slot in zip(*members, strict=True)], index, records))
        self._cpu_rows = [i for i, row in enumerate(self._rows) if not row.key]
        self._cpu_index = (torch.tensor(self._cpu_rows, dtype=torch.int64, device=self.device)
                           if self._cpu_rows else None)
        self._one_group = len(self._groups) == 1 and self._groups[0].index is None and not self._cpu_rows
        self._graphs = cuda_graph and self.device.type == "cuda"
        self._graph: tuple | None = None  # (key, graph, static input, static output)
        self._n_steps = 0
        self._out_shape: tuple | None = None  # of the packed results, known after the first step
        self.redone: list[int] = []  # the rows the last step redid on the CPU (decisions too close to call)

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def prefix_lengths(self) -> list[int]:
        """How many leading samplers of each row's chain run on the device."""
        return [row.prefix for row in self._rows]

    @property
    def n_groups(self) -> int:
        """How many device programs one step runs (rows with the same prefix shape share one)."""
        return len(self._groups)

    @property
    def graph_captured(self) -> bool:
        """Whether the step now replays a captured CUDA graph."""
        return self._graph is not None

    def describe(self, i: int) -> str:
        """Row ``i``'s chain with llama.cpp's marks: ``+name`` on the device, ``name`` on the CPU."""
        row = self._rows[i]
        names = [("+" if j < row.prefix and row.key else "") + s.display_name for j, s in enumerate(row.samplers)]
        return " -> ".join(["logits", *names])

    # --- sampling ------------------------------------------------------------------------------------------

    def sample(self, logits: torch.Tensor) -> list[int]:
        """One token per row (each accepted into its row's chain); ``logits`` is ``[B, n_vocab]`` on the device.

        Raises ``ValueError`` for a wrong shape, type or device, NaN or +inf logits, or a chain that selects
        nothing; the chains are then left exactly as they were.
        """
        x = self._check(logits)
        saved = [[(s, s.rng.mark()) for s in row.seeded] for row in self._rows]
        try:
            with torch.inference_mode():
                tokens, records, accepted = self._step(x, saved)
        except BaseException:
            for snap in saved:
                _restore(snap)
            raise
        for i, token in enumerate(tokens):
            if not accepted[i]:
                owner = self._rows[i].owner
                owner.record(records[i])
                owner.accept(token, is_generated=True)
        return tokens

    def _check(self, logits: object) -> torch.Tensor:
        if not isinstance(logits, torch.Tensor):
            raise ValueError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
        if logits.ndim != 2 or logits.shape[0] != len(self._rows) or logits.shape[1] == 0:
            raise ValueError(f"logits must have shape [{len(self._rows)}, n_vocab], got {list(logits.shape)}")
        if logits.shape[1] > 2**24:
            raise ValueError(f"n_vocab {logits.shape[1]} is above 2**24, the largest the device path handles")
        if not logits.is_floating_point():
            raise ValueError(f"logits must be floating point, got {logits.dtype}")
        if logits.device.type != self.device.type or (
                self.device.index is not None and logits.device.index != self.device.index):
            raise ValueError(f"logits are on {logits.device}, the sampler on {self.device}")
        if logits.dtype != torch.float32:
            return logits.detach().float()
        return logits if logits.is_contiguous() else logits.contiguous()

    def _program(self, x: torch.Tensor, inputs: list[dict], out: torch.Tensor | None = None) -> torch.Tensor:
        """The device part of a step: every group's prefix, packed into one float32 tensor (written into ``out``
        when given): the step's one transfer."""
        bm, row_max = block_max(x)
        if self._one_group:  # one group, the whole batch in order: one [B, 1 + C] block
            g = self._groups[0]
            g.last = g.run(x, bm, inputs[0])
            return torch.cat([row_max, *g.pack(g.last)], 1, out=out)
        pieces = [row_max.reshape(-1)]
        for g, g_inputs in zip(self._groups, inputs, strict=True):
            g.last = g.run(x, bm, g_inputs)
            pieces.append(torch.cat(g.pack(g.last), 1).reshape(-1))
        if self._cpu_index is not None:
            pieces.append(x.index_select(0, self._cpu_index).reshape(-1))
        return torch.cat(pieces, out=out)

    def _device_step(self, x: torch.Tensor, inputs: list[dict], out: torch.Tensor | None) -> torch.Tensor:
        """Run the step's program (on CUDA: replay its graph) and return its packed results, in ``out`` when the
        program runs on the CPU."""
        if not self._graphs:
            return self._program(x, inputs, out if self.device.type == "cpu" else None)
        if self._n_steps == 0 or not self._capturable():
            return self._program(x, inputs)
        key = (tuple(x.shape), x.dtype)
        if self._graph is None or self._graph[0] != key:
            self._capture(x, inputs, key)
        _, graph, static_x, static_out = self._graph
        static_x.copy_(x)
        graph.replay()
        return static_out

    def _capturable(self) -> bool:
        """A CUDA graph replays fixed buffers: every step input must be a number, and no row may keep device
        tensors of the step (the candidates of wide rows are read lazily)."""
        return all(len(g.widths) == len(g.input_slots) and
                   not (g.records and g.layout is not None and g.layout.selecting and g.layout.form is None)
                   for g in self._groups)

    def _capture(self, x: torch.Tensor, inputs: list[dict], key: tuple) -> None:
        static_x = x.clone()
        side = torch.cuda.Stream(device=x.device)
        side.wait_stream(torch.cuda.current_stream(x.device))
        with torch.cuda.stream(side):  # warm-up on a side stream, as torch.cuda.graphs asks
            self._program(static_x, inputs)
        torch.cuda.current_stream(x.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static_out = self._program(static_x, inputs)
        for g in self._groups:
            g.last = None  # graph-owned tensors: never read lazily
        self._graph = (key, graph, static_x, static_out)

    def _step(self, x: torch.Tensor, saved: list) -> tuple[list[int], list, list[bool]]:
        inputs = [g.stage(self.device) for g in self._groups]
        # a fresh host array per step (the rows' records keep views of it), the program's output on the CPU
        host = None if self._out_shape is None else np.empty(self._out_shape, dtype=np.float32)
        host_t = None if host is None else torch.from_numpy(host)
        out = self._device_step(x, inputs, host_t)
        with torch.profiler.record_function("samplechain::to_host"):  # the step's one device-to-host transfer
            if host is None:
                host = out.cpu().numpy()
                self._out_shape = host.shape
            elif out is not host_t:
                host_t.copy_(out)
        self._n_steps += 1
        pieces = self._split(host)
        row_max = pieces[0][:, 0]
        bad = np.flatnonzero(~(row_max < np.inf))
        if len(bad):
            raise ValueError(f"logits row {int(bad[0])} contains NaN or +inf")

        n = len(self._rows)
        tokens: list[int] = [-1] * n
        records: list = [None] * n
        accepted = [False] * n
        redo: list[int] = []
        for g, arr in zip(self._groups, pieces[1:], strict=False):
            self._read_group(g, arr, row_max, saved, tokens, records, redo)
        if self._cpu_rows:
            full = pieces[-1]
            for j, i in enumerate(self._cpu_rows):
                tokens[i], records[i], accepted[i] = self._cpu(i, full[j])
        self.redone = redo
        if redo:  # rare: a decision too close to call in the device arithmetic
            with torch.profiler.record_function("samplechain::to_host"):  # a second transfer, of these rows only
                full = x.index_select(0, torch.tensor(redo, device=x.device)).cpu().numpy()
            for j, i in enumerate(redo):
                _restore(saved[i])
                tokens[i], records[i], accepted[i] = self._cpu(i, full[j])
        return tokens, records, accepted

    def _split(self, host: np.ndarray) -> list[np.ndarray]:
        """The transfer cut back into its pieces: row maxima, each group's block, the CPU rows' logits."""
        if self._one_group:
            return [host[:, :1], host[:, 1:]]
        shapes = [(len(self._rows), 1)] + [(len(g.rows), -1) for g in self._groups]
        sizes = [len(self._rows)] + [len(g.rows) * self._block_width(g) for g in self._groups]
        if self._cpu_rows:
            shapes.append((len(self._cpu_rows), -1))
            sizes.append(host.size - sum(sizes))
        out, start = [], 0
        for shape, size in zip(shapes, sizes, strict=True):
            out.append(host[start : start + size].reshape(shape))
            start += size
        return out

    @staticmethod
    def _block_width(g: BatchGroup) -> int:
        lay = g.layout
        width = 1 + len(lay.draws)
        if lay.form is not None:
            width += {"all": 0, "n": 1, "live": lay.width}[lay.form] + (0 if lay.identity else lay.width) + lay.width
        return width

    def _read_group(self, g: BatchGroup, arr: np.ndarray, row_max: np.ndarray, saved: list, tokens: list,
                    records: list, redo: list) -> None:
        lay = g.layout
        codes = arr[:, 0].astype(np.int64).tolist()
        col = 1
        for slot in lay.draws:  # a draw the row did not make (e.g. XTC on a single candidate) is taken back
            for j in np.flatnonzero(arr[:, col] == 0).tolist():
                s = g.members[slot][j]
                _restore([(t, m) for t, m in saved[g.rows[j]] if t is s])
            col += 1
        cand = None
        if lay.form is not None:
            w = lay.width
            count = live = ids = None
            if lay.form == "n":
                count = arr[:, col].astype(np.int64)
                col += 1
            elif lay.form == "live":
                live = arr[:, col : col + w] != 0
                col += w
            if not lay.identity:
                ids = arr[:, col : col + w].astype(np.int32)
                col += w
            cand = (count, live, ids, arr[:, col : col + w])
        selector = g.members[-1] if lay.selecting else None
        for j, i in enumerate(g.rows):
            code = codes[j]
            if (code < 0 if lay.selecting else code != 0) or row_max[i] == -np.inf:
                redo.append(i)
            elif lay.selecting:
                tokens[i] = code
                if g.records:
                    records[i] = _Recorded(selector[j], code, lay.sorted, cand, j, g.last)
            else:
                c = _candidates(cand, j, lay.sorted)
                tokens[i] = self._finish(i, c)
                records[i] = c

    def _finish(self, i: int, c: Candidates) -> int:
        """The CPU rest of row ``i``'s chain on its reduced candidates."""
        for s in self._rows[i].samplers[self._rows[i].prefix :]:
            s.apply(c)
        if not 0 <= c.selected < len(c):
            raise ValueError(f"row {i}: no sampler selected a token ({self.describe(i)})")
        return int(c.ids[c.selected])

    def _cpu(self, i: int, logits: np.ndarray) -> tuple[int, Candidates | None, bool]:
        """Row ``i`` entirely on the CPU: the token, the final candidates, whether it was already accepted."""
        row = self._rows[i]
        if row.cpu_only:
            return row.owner.sample(logits), None, True
        c = Candidates.from_logits(logits)
        for s in row.samplers:
            s.apply(c)
        if not 0 <= c.selected < len(c):
            raise ValueError(f"row {i}: no sampler selected a token ({self.describe(i)})")
        return int(c.ids[c.selected]), c, False

    # --- logits processor ----------------------------------------------------------------------------------

    def process(self, logits: torch.Tensor) -> torch.Tensor:
        """The device prefix of every row as a logits processor: ``[B, n_vocab]`` logits after the chains'
        filtering and transforming samplers, removed tokens at -inf. Nothing is drawn or accepted.

        Every sampler of every chain must be device-capable, but for a final dist or greedy (which is skipped).
        """
        for i, row in enumerate(self._rows):
            rest = [s for s in row.samplers[row.prefix :] if not s.disabled]
            if row.cpu_only or (rest and (len(rest) > 1 or rest[0].name not in ("dist", "greedy"))):
                raise ValueError(f"row {i}: {self.describe(i)} has samplers without a device form after the "
                                 "prefix; a logits processor cannot run them")
        x = self._check(logits)
        with torch.inference_mode():
            bm, row_max = block_max(x)
            if not bool((row_max < float("inf")).all()):
                raise ValueError("logits contain NaN or +inf")
            out = torch.full_like(x, float("-inf"))
            redo: list[int] = []
            for g in self._groups:
                n_slots = len(g.members) - (g.members[-1][0].effect == SELECTOR)  # nothing is selected
                saved = [[(s, s.rng.mark()) for s in slot if hasattr(s, "rng")] for slot in g.members[:n_slots]]
                rows = g.run(x, bm, g.stage(self.device, n_slots), n_slots)
                for slot, used in rows.draws:  # draws a row did not make are taken back
                    for j in (used[:, 0] == 0).nonzero()[:, 0].tolist():
                        _restore([saved[slot][j]])
                mask = rows.mask()
                vals = rows.logits if mask is None else rows.logits.masked_fill(~mask, float("-inf"))
                if not rows.identity:
                    vals = torch.full((rows.batch, rows.n_vocab), float("-inf"), device=x.device).scatter_(
                        1, rows.ids, vals)
                out.index_copy_(0, torch.tensor(g.rows, device=x.device), vals)
                redo += [g.rows[j] for j in rows.unsure().nonzero()[:, 0].tolist()]
            for i in redo:  # rare: a decision too close to call in the device arithmetic
                c = Candidates.from_logits(x[i].cpu().numpy())
                for s in self._rows[i].samplers[: self._rows[i].prefix]:
                    s.apply(c)
                row = torch.full((x.shape[1],), float("-inf"))
                row[torch.from_numpy(c.ids.astype(np.int64))] = torch.from_numpy(np.ascontiguousarray(c.logits))
                out[i] = row.to(x.device)
        return out.clone()


def _candidates(cand: tuple, j: int, is_sorted: bool) -> Candidates:
    """Row ``j``'s candidate array from a group's transferred block (count or mask, ids, logits)."""
    count, live, ids, logits = cand
    keep = slice(None) if count is None and live is None else (
        slice(0, int(count[j])) if live is None else live[j].nonzero()[0])
    row_ids = np.arange(logits.shape[1], dtype=np.int32) if ids is None else ids[j]
    return Candidates(row_ids[keep], np.ascontiguousarray(logits[j][keep]), sorted=is_sorted)


class _Recorded:
    """A device-selected row's final candidates, built on first read: from the transferred block (narrow rows)
    or, for wide rows, from the step's device tensors (one more transfer, only when read)."""

    __slots__ = ("cand", "j", "rows", "selector", "sorted", "token")

    def __init__(self, selector: Sampler, token: int, is_sorted: bool, cand: tuple | None, j: int,
                 rows: Rows | None) -> None:
        self.selector, self.token, self.sorted, self.cand, self.j = selector, token, is_sorted, cand, j
        self.rows = rows if cand is None else None

    def __call__(self) -> Candidates:
        if self.cand is not None:
            c = _candidates(self.cand, self.j, self.sorted)
        else:
            r, j = self.rows, self.j
            mask = r.mask()
            cand = (None, None if mask is None else mask[j : j + 1].cpu().numpy(),
                    None if r.ids is None else r.ids[j : j + 1].cpu().numpy().astype(np.int32),
                    r.logits[j : j + 1].cpu().numpy())
            c = _candidates(cand, 0, self.sorted)
        c.selected = int(np.flatnonzero(c.ids == self.token)[0])
        self.selector.device_record(c)
        return c


def _restore(snapshot: list) -> None:
    for s, mark in snapshot:
        s.rng.rewind(mark)
