"""The configuration reference (docs/configuration.md), generated from the schema.

Each key's type, default, allowed values and help come from its field: a
:class:`~fedapp.config.schema.Settings` field for the keys every run reads, a field of its
method's :class:`~fedapp.options.MethodOptions` for a method's own (their sections and
notes are made from the catalog: :func:`method_groups`). This module adds only what the
fields cannot say: the page's introduction, how the common keys are grouped (:data:`GROUPS`,
which must name every key exactly once) and a few notes per group.
``python -m fedapp.config.reference`` prints the page and ``--write PATH`` writes it; a unit
test keeps docs/configuration.md equal to this output.

Why this module is long: it is the page's prose, one group of keys after another, kept
next to the key lists it describes; splitting it would split the page.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from fedapp.catalog import CATALOG
from fedapp.config.schema import METHOD_KEYS, SCHEMA
from fedapp.options import Key, toml_value

COMMAND = "python -m fedapp.config.reference --write docs/configuration.md"
"""What regenerates the committed page after a schema change."""


def _keys(names: str) -> tuple[str, ...]:
    """``"lr momentum"`` -> ``("lr", "momentum")``: a group's keys, written compactly."""
    return tuple(names.split())


@dataclass(frozen=True)
class Group:
    """A section of the reference: a heading, notes in Markdown and a table of keys (if any)."""

    title: str
    keys: tuple[str, ...]
    notes: tuple[str, ...] = ()
    level: int = 2


INTRO = (
    "Every key a run accepts is declared once, with its type, default and allowed range: the keys every run "
    "reads as fields of `Settings` in `fedapp/config/schema.py`, each method's own as fields of its options "
    "class beside its math (`fedapp/methods/*_options.py`). This page is generated from those fields "
    f"(`{COMMAND}`; a unit test fails while it is out of date), so edit the fields, not the page.",
    "A run's configuration is set in three layers, each over the one before:",
    "1. **Defaults**: `pyproject.toml` declares every key at its default under `[tool.flwr.app.config]` "
    "(a test keeps that table equal to the schema).\n"
    '2. **A YAML preset**: `preset="conf/<name>.yaml"` names a file of `key: value` pairs (a relative path is '
    "looked up from the working directory, then from the app's root; a preset may not name another preset). "
    "`python -m fedapp.launch --preset conf/<name>.yaml` does the same.\n"
    "3. **Explicit overrides**: `--run-config 'key=value ...'` (TOML values: strings in double quotes), "
    "e.g. `--run-config 'method=\"standalone\" num-rounds=5'`.",
    "Inside Flower an override is recognised as a value that differs from the default, so "
    "`flwr run --run-config 'preset=... lr=0.05'` cannot restore the default `lr` over a preset that changes it; "
    "`python -m fedapp.launch` applies the preset before submitting the run, so there every explicit value wins.",
    "The whole configuration is validated before any data is loaded: an unknown key, a wrong type, an "
    "out-of-range value, an unknown method, dataset or model, contradictory settings (the cross-key rules in "
    "`fedapp/config/rules.py`) or a missing path stops the run with one message that names the key and the "
    "value, e.g. `config key 'alpha' = -1.0 must be > 0.0`; a misspelt key or value also gets the name it "
    "likely meant: `unknown config key 'num-round': did you mean 'num-rounds'?`. `python -m fedapp.launch` "
    "and `python -m fedapp.sweep` also look for the CLIP checkpoint file that `pretrained` names before they "
    "start anything (in a deployment each process that loads CLIP looks for its own). Under a plain "
    "`flwr run .`, Flower checks the keys against `pyproject.toml` before any code of ours runs and refuses a "
    "misspelt one with `[code: 15] Invalid run configuration.`, without naming it; the same `--run-config` "
    "given to `python -m fedapp.launch` names it and starts nothing. In code a validated "
    "configuration is a `fedapp.config.RunConfig`, with one typed attribute per common key (`num-rounds` is "
    "`config.num_rounds`) and its method's own keys as `config.options` (`config.options.sdfed_lambda`); "
    '`config["sdfed-lambda"]` reads any key by its name.',
    "In the tables, *default* is the value as `pyproject.toml` writes it and *allowed* is what a key accepts "
    "on its own; each section's notes name the main rules that tie its keys to others.",
)


def method_groups() -> tuple[Group, ...]:
    """A section per options class the catalog's methods declare, in catalog order: the keys it declares
    that no section before it lists, its notes (``about``), and the methods that read them."""
    readers: dict[type, list[str]] = {}
    for name, spec in CATALOG.items():
        if any(key in METHOD_KEYS for key in spec.keys):
            readers.setdefault(spec.options, []).append(name)
    groups: list[Group] = []
    listed: set[str] = set()
    for options, methods in readers.items():
        keys = [key for key in options.config_keys() if key in METHOD_KEYS]
        new, earlier = tuple(key for key in keys if key not in listed), [key for key in keys if key in listed]
        listed.update(new)
        read_by = f"Read by {', '.join(f'`{method}`' for method in methods)}."
        if earlier:
            read_by += f" Also read: {', '.join(f'`{key}`' for key in earlier)} (in a section above)."
        notes = (*((options.about,) if options.about else ()), read_by)
        groups.append(Group(options.title or ", ".join(methods), new, notes, level=3))
    return tuple(groups)


GROUPS: tuple[Group, ...] = (
    Group(
        "Run and data",
        _keys(
            "preset method seed dataset data-dir test-data-dir hf-name hf-image-column hf-label-column download "
            "image-size local-split reserve-pretrain reserve-test reserve-seed shots-per-class"
        ),
        (
            "`method` picks one of the methods, each with its page under *Methods*. `dataset`: `digits` is "
            "offline, bundled with scikit-learn; `imagefolder` reads a folder or `.tar.gz` with a subfolder per "
            "class (`data-dir`); `domains` a folder or `.tar.gz` with one ImageFolder subfolder per domain; "
            "`cifar10` and `cifar100` a torchvision root (`download = true` lets torchvision fetch it); `hf` a "
            "Hugging Face dataset loaded through flwr-datasets (needs network): the images are its only `Image` "
            "column and the labels its only `ClassLabel` column; where a split has several (CIFAR-100's "
            "`fine_label` and `coarse_label`), `hf-label-column` (or `hf-image-column`) names the one to use.",
            "`test-data-dir` is an external test split: each client's test set is drawn from it with the client's "
            "label distribution. `reserve-pretrain` and `reserve-test` carve the source per class, seeded by "
            "`reserve-seed` only: a share the run never loads (kept for pretraining a backbone, see "
            "`benchmarks/pretrain_clip.py`) and a share that is the clients' test pool (used like "
            "`test-data-dir`, so set only one of the two); the clients partition the rest. A CLIP run with "
            '`pretrained = "reserve"` loads a backbone pretrained on that held-back share by the project\'s own '
            "recipe (`fedapp/backbones.py`): made by the first process on a machine that needs it (the launcher "
            "and the sweep, before Flower starts; the time it takes and its zero-shot accuracy on the "
            "`reserve-test` share are printed), then cached under `cache-dir/pretrained/` by its model, data, "
            "recipe and carve. "
            "`shots-per-class = 16` is the [few-shot](protocols.md#few-shot) protocol.",
        ),
    ),
    Group(
        "Partitioning",
        _keys(
            "num-partitions partition alpha classes-per-client class-assignment shards-per-client clients-per-domain "
            "synthetic-domains"
        ),
        (
            "`num-partitions` is the number of clients when the node config does not say (a simulation sets it). "
            "`partition`: `iid`; `dirichlet` by `alpha`; `pathological` with `classes-per-client` "
            "classes a client, chosen by `class-assignment` (the default draws them with the seed, client i always "
            "holding class i mod C so that every class has a client; `deterministic` gives client i the classes "
            "i, i+1, ... under every seed); `shard` with "
            "`shards-per-client`; `domain` gives each domain to `clients-per-domain` clients, which split it by "
            "Dirichlet with `alpha` (see [Multi-domain clients](protocols.md#multi-domain-clients)).",
            "`synthetic-domains` turns any dataset into k = 2..6 deterministic domains (`grayscale`, `blur`, "
            "`colour-shift`, `rotation`, `noise`, `inverted`, in that order); with `partition = domain`, "
            "`num-partitions` must then be k × `clients-per-domain`.",
        ),
    ),
    Group(
        "Rounds and local training",
        _keys(
            "num-rounds fraction-fit fraction-evaluate min-clients local-epochs batch-size lr momentum "
            "weight-decay device api"
        ),
        (
            "`min-clients` may not exceed `num-partitions`. `device = auto` trains on `cuda` when torch sees a "
            "GPU, else on the CPU, with one log line per process saying which (see [GPUs](getting-started.md#gpus)).",
            "`api` is the Flower API our ServerApp drives the method's strategy on: `legacy` (Flower's `Strategy` "
            "and `NumPyClient`) or `message` (the Message API of Flower's `flwr new` templates, through "
            "`MessageStrategy`); the method computes and records the same either way, our ClientApp answers "
            "both, and `secagg = true` needs `legacy` (Flower offers SecAgg+ only on its legacy workflow). "
            "The run config may also name two keys as those templates do: `num-server-rounds` is read as "
            "`num-rounds` and `fraction-train` as `fraction-fit` (set only one name of each, or both to the same "
            "value), so an app made with `flwr new` keeps its `[tool.flwr.app.config]`; `fraction-evaluate`, "
            "`local-epochs` and `lr` are ours already (see "
            "[Using our strategies in your own ServerApp](deployment.md#using-our-strategies-in-your-own-serverapp)).",
        ),
    ),
    Group(
        "Models",
        _keys("model client-models clip-model client-clip-models pretrained precision"),
        (
            "The CNN methods build `model` from the zoo; `client-models` cycles a list over the clients (client k "
            "gets entry k mod its length; `cnn-1,cnn-2,cnn-3,cnn-4,cnn-5` is pFedLoRA's heterogeneous setting), "
            "which only the methods that do not average whole models accept.",
            "The CLIP methods load `clip-model` with open_clip (one per client: `client-clip-models`), from "
            "`pretrained` (an open_clip tag or a local checkpoint), their frozen encoders in `precision` (see "
            "[GPUs](getting-started.md#gpus)).",
        ),
    ),
    Group(
        "Per-method hyperparameters",
        (),
        (
            "Each method declares the keys of its own mechanism beside its math (a `MethodOptions` dataclass "
            "named by its `MethodSpec`, see [Adding a method](extending.md)), and the sections below are made "
            "from those declarations. A method reads its own keys and leaves the others' alone: a run that sets "
            "another method's key away from its default is warned, by name, that it computes as without it. "
            "In code, a strategy or a client reads its method's keys as `self.options` (`self.options.sdfed_lambda`).",
        ),
    ),
    *method_groups(),
    Group(
        "Evaluation protocols",
        _keys("held-out-fraction held-out-draw held-out-domain base-to-novel target-accuracy"),
        (
            'Held-out clients are drawn from `seed`, by default (`held-out-draw = "covered"`) only clients '
            "whose every class keeps a training client; methods whose global state can serve a new client evaluate "
            "them each round (`held_out_acc_mean` in the metrics), and the rest must still number at least "
            "`min-clients` (see [Held-out clients](protocols.md#held-out-clients-and-leave-one-domain-out)). "
            "`base-to-novel` needs a method that can name classes it never saw (the text-prompt methods; see "
            "[Base-to-novel classes](protocols.md#base-to-novel-classes)). `target-accuracy` sets the "
            "rounds- and MB-to-target columns of the summary.",
        ),
    ),
    Group(
        "Reliability and robust aggregation",
        _keys("round-timeout resume traceback aggregation trim-fraction byzantine-clients update-norm-bound"),
        (
            "A client that does not answer within `round-timeout` counts as failed (see "
            "[Failing clients](reliability.md#failing-clients)); `resume` continues the run in "
            "`results-dir/run-name` from its checkpoint (see "
            "[Resuming a stopped run](reliability.md#resuming-a-stopped-run); a method whose clients keep "
            'personal state resumes only with `state = "disk"`). Without `traceback` each error is '
            "one line (`error: ...`, or the client's own message in the round's *left out* line).",
            "A robust `aggregation` rule applies to the methods that average a shared model, needs each client's "
            "update (so not with `secagg`) and enough updates a round for `byzantine-clients`; `trim-fraction` "
            "must be below 0.5 (see [Robust aggregation](reliability.md#robust-aggregation)).",
        ),
    ),
    Group(
        "Privacy",
        _keys(
            "dp dp-noise-multiplier dp-clipping-norm dp-delta secagg secagg-num-shares "
            "secagg-reconstruction-threshold secagg-clipping-range secagg-quantization-range secagg-max-weight"
        ),
        (
            "Both apply to the methods whose server averages parameters, and not yet together (see "
            "[Differential privacy](privacy.md#differential-privacy) and "
            "[Secure aggregation](privacy.md#secure-aggregation-secagg)). `dp-delta` must be below 1; "
            "SecAgg+ needs `min-clients` ≥ 2, whole share counts above 1, and `secagg-quantization-range` × "
            "`num-partitions` below the modulus 2³².",
        ),
    ),
    Group(
        "Paths and state",
        _keys("results-dir run-name cache-dir state state-dir personal-state-from tracker tracking-uri export-models"),
        (
            "A run writes its folder `results-dir/run-name`; a run name is one folder name (no `/`, `\\` or "
            "`..`), and an empty one is derived from the method, dataset, partition, a digest of every setting "
            "that differs from its default, and the seed, so that runs with different settings never share a "
            "folder. `cache-dir` defaults to `$FEDAPP_CACHE_DIR` or `~/.cache/fedapp`.",
            "`state = disk` keeps a simulation's memory flat with many clients and large personal models, and is "
            "faster: Flower ships a node's context to the worker with every message (see `benchmarks/scale.py`). "
            "On a SuperNode the node config's `state-dir` and `cache-dir` decide, never the run config's (see "
            "[Across machines](deployment.md#across-machines-tls-and-authenticated-supernodes)).",
            "Personal state belongs to one run: every instruction carries the run's token (kept in its "
            "checkpoint, so `resume = true` sends the same one), and a node sets aside, whole, state that another "
            "run left under the same name (`<state-dir>/<run-name>/partition-<id>.run-<token>`) instead of "
            "loading it. A new run continues an earlier run's personal models only when `personal-state-from` "
            "names that run; each node copies that state and records it in its `run.json`, and the run's "
            "`summary.json` records where its global state began.",
            "`tracker = mlflow` also logs the resolved configuration, every round's metrics and the run's files to "
            "MLflow (`tracking-uri`, by default a SQLite database in `results-dir`); `tracker = tensorboard` writes "
            'event files to the run folder\'s `tensorboard/`. Both need `pip install -e ".[tracking]"`; '
            "`metrics.jsonl` is written either way. `export-models` writes the global model and each evaluated "
            "client's personal model as safetensors under the run folder's `models/` (see "
            "[Results](results.md)).",
        ),
    ),
)


def _number(value: float) -> str:
    """``1.0`` -> ``1``, ``0.5`` -> ``0.5``: bounds read as plain numbers."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _cell(text: str) -> str:
    """Plain text made safe inside a Markdown table cell: no column breaks, tags or emphasis."""
    for char, escaped in (("\\", "\\\\"), ("|", "\\|"), ("<", "&lt;"), (">", "&gt;"), ("*", "\\*"), ("_", "\\_")):
        text = text.replace(char, escaped)
    return text


def allowed(key: Key) -> str:
    """What one key accepts on its own, as Markdown: its choices, its range, or its type's values.

    Parameters
    ----------
    key : Key
        Its schema entry.

    Returns
    -------
    str
        E.g. ``"`iid`, `dirichlet`"``, ``"0 < x ≤ 1"``, ``"≥ 1"`` or ``"any text"``.
    """
    if key.choices is not None:
        return ", ".join(f"`{choice}`" for choice in key.choices)
    if key.type is bool:
        return "`true`, `false`"
    if key.names:  # a model of the zoo, which a cross-key rule checks (not a choice in the schema)
        from fedapp.models import MODEL_NAMES  # noqa: PLC0415 - torch only for this page

        names = ", ".join(f"`{model}`" for model in MODEL_NAMES)
        return f"comma list of: {names}" if key.names == "zoo-models" else names
    low = None if key.low is None else _number(key.low)
    if low is not None and key.high is not None:
        return f"{low} {'<' if key.low_open else '≤'} x ≤ {_number(key.high)}"
    if low is not None:
        return f"{'>' if key.low_open else '≥'} {low}"
    if key.high is not None:
        return f"≤ {_number(key.high)}"
    return "any text" if key.type is str else "any finite number"


def key_row(name: str, key: Key) -> str:
    """One table row: key, type, default, allowed values and help."""
    cells = (f"`{name}`", key.type.__name__, f"`{toml_value(key.default)}`", allowed(key), _cell(key.help))
    return "| " + " | ".join(cells) + " |"


def group_section(group: Group) -> str:
    """A group's heading, notes and (when it has keys) its table."""
    parts = ["#" * group.level + " " + group.title, *group.notes]
    if group.keys:
        rows = [key_row(name, SCHEMA[name]) for name in group.keys]
        parts.append("\n".join(["| key | type | default | allowed | help |", "|---|---|---|---|---|", *rows]))
    return "\n\n".join(parts)


def check_groups(groups: tuple[Group, ...] = GROUPS) -> None:
    """Check that ``groups`` name every schema key exactly once, and nothing else.

    Raises
    ------
    ValueError
        Naming the keys found in two groups, in none, and the names that are not keys.
    """
    named = [name for group in groups for name in group.keys]
    twice = sorted({name for name in named if named.count(name) > 1})
    missing = [name for name in SCHEMA if name not in named]
    unknown = sorted(set(named) - set(SCHEMA))
    if twice or missing or unknown:
        raise ValueError(
            f"fedapp.config.reference.GROUPS must name every key once: named twice {twice}, in no group "
            f"{missing}, not a key {unknown}"
        )


def render() -> str:
    """The whole reference page.

    Returns
    -------
    str
        Markdown: the introduction, then a section per group, ending in one newline.
    """
    check_groups()
    header = f"<!-- Generated from fedapp/config/schema.py by `{COMMAND}`: edit the schema, not this page. -->"
    parts = [header, "# Configuration", *INTRO, *(group_section(group) for group in GROUPS)]
    return "\n\n".join(parts) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Print the reference, or write it to ``--write PATH``.

    Parameters
    ----------
    argv : list of str, optional
        The command-line arguments (default: ``sys.argv[1:]``).

    Returns
    -------
    int
        The exit status, 0.
    """
    parser = argparse.ArgumentParser(prog="python -m fedapp.config.reference", description=__doc__.splitlines()[0])
    parser.add_argument("--write", metavar="PATH", type=Path, help="write the page here instead of printing it")
    args = parser.parse_args(argv)
    page = render()
    if args.write is None:
        sys.stdout.write(page)
    else:
        args.write.write_text(page, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
