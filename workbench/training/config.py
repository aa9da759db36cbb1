"""The settings of one training run: the shipped full run and the tiny test run.

``asdict(config)`` is what ``hparams.json`` and ``training_info.json`` record, so the
field names and their order are those of the shipped ``data/models/training_info.json``.
"""

from __future__ import annotations

from dataclasses import dataclass

from .model import DrafterConfig, TargetConfig


def aux_layer_ids(n_layers: int, spec: str = "auto") -> list[int]:
    """Three target layers whose incoming residual stream feeds the drafter.

    vLLM numbering: id i is the residual stream entering layer i (0 = embeddings,
    L = last layer's output before the final norm); always ascending, since vLLM
    concatenates them in layer order.  ``auto`` takes vLLM's own default
    ``(2, L//2, L-3)`` where those are distinct (L >= 7), the layers a real EAGLE3 head
    reads (Llama-3.1-8B: 2, 16, 29); shallower targets fall back to ``{1, L//2, L}``.
    (Measured in grid.json: reading the last layer instead changed the drafter's
    KV dependence little; dropout in the target changed it a lot.)"""
    if spec != "auto":
        return _parse_aux_layers(n_layers, spec)
    if n_layers >= 7:
        return [2, n_layers // 2, n_layers - 3]
    if n_layers >= 4:
        return sorted({1, n_layers // 2, n_layers})
    return list(range(n_layers + 1))[-3:]


def _parse_aux_layers(n_layers: int, spec: str) -> list[int]:
    try:
        ids = sorted(int(x) for x in str(spec).split(","))
    except ValueError:
        ids = []
    if len(ids) != 3 or len(set(ids)) != 3 or ids[0] < 0 or ids[-1] > n_layers:
        raise SystemExit(f"--aux-layers {spec!r}: need three distinct ids in 0..{n_layers}")
    return ids


@dataclass(frozen=True)
class TrainConfig:
    """Model shape, step counts and learning rates of the target and drafter stages."""

    vocab: int
    layers: int
    hidden: int
    inter: int
    heads: int
    seq: int
    """Window length in tokens, BOS included (``sample_batch``)."""
    batch: int
    target_steps: int
    target_lr: float
    drafter_steps: int
    drafter_lr: float
    draft_vocab: int
    """The most frequent training tokens: the only ones the drafter can propose (d2t/t2d)."""
    ttt_steps: int
    """Training-time-test unroll depth: the drafts per chain it learns (evaluate's k)."""
    weight_decay: float
    """For the target stages only; the drafter trains without weight decay."""
    max_files: int | None
    """None: the whole stdlib corpus; a number: a spread-out subset (tiny runs)."""
    ul_steps: int
    """Unlikelihood fine-tune steps after the target (0: no such stage)."""
    ul_weight: float
    ul_lr: float
    dropout: float
    """Target residual dropout; at 0.1 (grid.json) the drafter came to depend less on its KV."""
    aux_layers: str
    """``auto`` (vLLM's default ids, see :func:`aux_layer_ids`) or three ids such as ``2,4,5``."""

    def __post_init__(self) -> None:
        aux_layer_ids(self.layers, self.aux_layers)  # a bad --aux-layers fails before any work

    def tokens_seen(self, steps: int) -> int:
        """Tokens predicted in ``steps`` batches (every window position after BOS)."""
        return steps * self.batch * (self.seq - 1)

    def target_config(self) -> TargetConfig:
        return TargetConfig(vocab_size=self.vocab, hidden_size=self.hidden,
                            intermediate_size=self.inter, num_hidden_layers=self.layers,
                            num_attention_heads=self.heads, num_key_value_heads=self.heads)

    def drafter_config(self) -> DrafterConfig:
        return DrafterConfig(vocab_size=self.vocab, draft_vocab_size=self.draft_vocab,
                             hidden_size=self.hidden, target_hidden_size=self.hidden,
                             intermediate_size=self.inter, num_attention_heads=self.heads,
                             num_key_value_heads=self.heads,
                             aux_layer_ids=aux_layer_ids(self.layers, self.aux_layers))


# the shipped pair (data/models): grid variant "n8-ul" (see workbench/training/grid.py,
# data/models/grid.json): ~8 epochs, no dropout, then 300 unlikelihood steps
FULL = TrainConfig(vocab=2048, layers=8, hidden=256, inter=704, heads=4, seq=512, batch=32,
                   target_steps=1216, target_lr=2e-3, drafter_steps=1000, drafter_lr=1.5e-3,
                   draft_vocab=1024, ttt_steps=3, weight_decay=0.1, max_files=None, ul_steps=300,
                   ul_weight=1.0, ul_lr=5e-4, dropout=0.0, aux_layers="auto")
# about 10 s on a CPU: for tests, not a useful model
TINY = TrainConfig(vocab=512, layers=2, hidden=64, inter=176, heads=2, seq=64, batch=8,
                   target_steps=60, target_lr=3e-3, drafter_steps=30, drafter_lr=3e-3,
                   draft_vocab=256, ttt_steps=3, weight_decay=0.1, max_files=40, ul_steps=0,
                   ul_weight=1.0, ul_lr=5e-4, dropout=0.0, aux_layers="auto")

# a work dir may resume with other values of these (the stages check a new step total
# against their schedules, see loop._check_total); the rest must match its hparams.json
RESUMABLE_FIELDS = ("target_steps", "drafter_steps", "ul_steps", "ul_weight", "ul_lr")
# the fields with a command-line flag (--layers, --target-lr, ...), by type; max_files has none
INT_FIELDS = ("layers", "hidden", "inter", "heads", "seq", "batch", "target_steps",
              "drafter_steps", "draft_vocab", "ttt_steps", "vocab", "ul_steps")
FLOAT_FIELDS = ("target_lr", "drafter_lr", "weight_decay", "ul_weight", "ul_lr", "dropout")
