"""Cross-key rules of how the server combines the uploads: robust aggregation, client-level DP and SecAgg+.

:data:`UPLOAD_RULES` are the last rules :func:`fedapp.config.validate` runs;
the Flower layer's DP wrapper calls :func:`check_dp_config` again for the run it
wraps. :data:`fedapp.secagg.MODULUS_RANGE` bounds SecAgg+'s integer arithmetic.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from fedapp.aggregation import min_updates
from fedapp.catalog import CATALOG, methods_where
from fedapp.errors import ConfigError
from fedapp.secagg import MODULUS_RANGE

if TYPE_CHECKING:
    from fedapp.config.validated import RunConfig


def _check_aggregation(config: RunConfig) -> None:
    rule = config.aggregation
    if config.trim_fraction >= 0.5:
        raise ConfigError(
            f"config key 'trim-fraction' = {config.trim_fraction!r} must be < 0.5 (it is cut from each end)"
        )
    if rule == "mean":
        return
    spec = CATALOG[config.method]
    if not spec.averages_parameters:
        raise ConfigError(
            f"config key 'aggregation' = {rule!r} applies to methods that average a shared model "
            f"({', '.join(methods_where(averages_parameters=True))}); {config.method!r} {spec.uploads_note}"
        )
    if config.secagg:
        raise ConfigError(
            f"config key 'aggregation' = {rule!r} needs each client's update, but secagg = true shows the server "
            "only their sum: use one of them"
        )
    sampled = max(config.min_clients, math.floor(config.fraction_fit * config.num_partitions))
    needed = min_updates(rule, config.byzantine_clients)
    if sampled < needed:
        raise ConfigError(
            f"config key 'aggregation' = {rule!r} with byzantine-clients = {config.byzantine_clients} needs at least "
            f"{needed} updates a round, but a round samples about {sampled} clients (num-partitions x fraction-fit)"
        )


def _check_secagg(config: RunConfig) -> None:
    if config.secagg:
        check_secagg_config(config)


def _check_dp(config: RunConfig) -> None:
    if config.dp_delta >= 1:
        raise ConfigError(f"config key 'dp-delta' = {config.dp_delta!r} must be < 1")
    if config.dp != "off":
        check_dp_config(config)


def check_dp_config(config: RunConfig) -> None:
    """Refuse DP for a method whose uploads are not parameters the server averages."""
    method = config.method
    spec = CATALOG[method]
    if not spec.averages_parameters:
        raise ConfigError(
            f"config key 'dp' = {config.dp!r}: method {method!r} {spec.uploads_note}. Client-level DP here covers the "
            f"methods whose server averages parameters: {', '.join(methods_where(averages_parameters=True))}"
        )
    if config.secagg:
        raise ConfigError(
            f"config keys 'dp' = {config.dp!r} and 'secagg' = true cannot be combined yet: SecAgg+ averages the "
            "uploads weighted by example counts on the clients, while the DP noise is calibrated to a uniform "
            "average of clipped updates (each client moving it by at most C / clients)"
        )


def check_secagg_config(config: RunConfig) -> None:
    """The rules of a run with ``secagg = true`` (a ConfigError names the broken one)."""
    method = config.method
    spec = CATALOG[method]
    if not spec.averages_parameters:
        raise ConfigError(
            f"config key 'secagg' = true: method '{method}' cannot use secure aggregation, because it "
            f"{spec.uploads_note}; methods that can: {', '.join(methods_where(averages_parameters=True))}"
        )
    if config.api == "message":
        raise ConfigError(
            "config keys 'secagg' = true and 'api' = 'message': Flower 1.42 offers SecAgg+ only through its legacy "
            "workflow (SecAggPlusWorkflow + secaggplus_mod); run secure aggregation with api = 'legacy'"
        )
    if config.resume:
        raise ConfigError(
            "config keys 'secagg' = true and 'resume' = true: resuming a run under secure aggregation is not "
            "supported; start the run afresh (or resume with secagg = false)"
        )
    min_clients = config.min_clients
    if min_clients < 2:
        raise ConfigError(
            f"config key 'min-clients' = {min_clients}: secure aggregation needs at least 2 clients per round "
            "(one client's 'sum' would be its own upload); set min-clients >= 2"
        )
    shares = config.secagg_num_shares
    if shares > 1 and (shares != int(shares) or shares < 3):
        raise ConfigError(
            f"config key 'secagg-num-shares' = {config.secagg_num_shares}: a value > 1 is a number of shares and "
            "must be a whole number >= 3 (a value <= 1 is a share of the round's clients; 1.0 = all of them)"
        )
    threshold = config.secagg_reconstruction_threshold
    if threshold > 1:
        if threshold != int(threshold):
            raise ConfigError(
                f"config key 'secagg-reconstruction-threshold' = {config.secagg_reconstruction_threshold}: a value "
                "> 1 is a number of shares and must be a whole number (a value <= 1 is a fraction of the shares)"
            )
        if shares > 1 and threshold >= shares:
            raise ConfigError(
                f"config key 'secagg-reconstruction-threshold' = {int(threshold)} must be less than "
                f"'secagg-num-shares' = {int(shares)}"
            )
        if threshold > min_clients:
            raise ConfigError(
                f"config key 'secagg-reconstruction-threshold' = {int(threshold)} is more than 'min-clients' = "
                f"{min_clients}: a round with min-clients participants could never unmask its sum"
            )
    levels = config.secagg_quantization_range
    clients = config.num_partitions
    if levels * clients >= MODULUS_RANGE:
        raise ConfigError(
            f"config key 'secagg-quantization-range' = {levels}: times 'num-partitions' = {clients} it reaches "
            f"the modulus 2**32, so the masked sum could overflow; lower it below {MODULUS_RANGE // clients}"
        )


UPLOAD_RULES: tuple[Callable[[RunConfig], None], ...] = (_check_dp, _check_secagg, _check_aggregation)
"""The rules on combining uploads, in the order :func:`fedapp.config.validate` runs them."""
