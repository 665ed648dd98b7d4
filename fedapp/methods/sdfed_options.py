"""SDFed's own configuration keys (:mod:`fedapp.methods.sdfed` is its math).

Plain data, read by the configuration in every process: no torch here (the local prompt
lengths are drawn with numpy, imported only when they are).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from fedapp.methods.text_prompt_options import TextPromptOptions
from fedapp.options import setting


@dataclass(frozen=True)
class SDFedOptions(TextPromptOptions):
    """The private local prompts, the subspace refinement and the divergence control."""

    title: ClassVar[str] = "SDFed"
    about: ClassVar[str] = (
        "See [SDFed](methods/sdfed.md). `local-prompt-lengths` is one number, a comma list cycled over "
        "clients, or a seeded draw `random:A-B`; the paper's `random:4-64` needs a 77-token model such as "
        "ViT-B-16 (`conf/sdfed-vitb16.yaml`). `projector-mode`, `sdfed-combination` and "
        "`sdfed-separation-moves-global` choose between readings of the paper (its page says which is which)."
    )

    local_prompt_lengths: str = setting("random:4-16", "SDFed local prompt lengths: 16, a list 4,8,16, or random:4-64")
    sdfed_lambda: float = setting(0.6, "SDFed share of the global prompt's directions removed", low=0.0, high=1.0)
    sdfed_gamma: float = setting(0.8, "SDFed divergence margin", low=0.0)
    sdfed_alpha: float = setting(1.0, "SDFed weight of information retention L_str", low=0.0)
    sdfed_beta: float = setting(1.0, "SDFed weight of divergence control L_sep", low=0.0)
    projector_mode: Literal["dim", "rank"] = setting(
        "dim",
        "SDFed projector: the paper's floor(lambda * token width) directions (dim) or floor(lambda * rank(G_s)) (rank)",
    )
    sdfed_combination: Literal["average", "sequence"] = setting(
        "sequence",
        "SDFed: average the cosines of [G_s][class] and [refined G_c][class] (average) or encode one "
        "sequence [G_s][refined G_c][class] (sequence)",
    )
    sdfed_separation_moves_global: bool = setting(
        True, "SDFed: L_sep's gradient reaches the global prompt too (true, the loss as written) or only G_c"
    )

    def local_lengths(self, num_clients: int, seed: int) -> list[int]:
        """Each client's local prompt length (the same in every process for one seed)."""
        from fedapp.methods.local_prompt_lengths import parse_local_lengths  # noqa: PLC0415 - numpy

        return parse_local_lengths(self.local_prompt_lengths, num_clients, seed)

    def check(self, values: Mapping[str, Any]) -> None:
        self.local_lengths(values["num-partitions"], values["seed"])  # a ConfigError names the key

    def text_prompt_lengths(self, values: Mapping[str, Any]) -> list[tuple[str, list[int]]]:
        """The shared prompt, and the local prompt each client reads; with ``sdfed-combination =
        "sequence"`` one sequence holds the global prompt and the local one, so each length is the two added."""
        spec = self.local_prompt_lengths
        drawn = self.local_lengths(values["num-partitions"], values["seed"])
        what = f"config key 'local-prompt-lengths' = {spec!r}"
        if self.sdfed_combination == "sequence":
            drawn = [self.prompt_length + length for length in drawn]
            what = (
                f"config keys 'prompt-length' = {self.prompt_length!r} and 'local-prompt-lengths' = {spec!r} "
                "with sdfed-combination = 'sequence'"
            )
        return [*super().text_prompt_lengths(values), (what, drawn)]
