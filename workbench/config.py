"""Configuration dataclasses and every up-front validation.

All checks run before any server starts, so a typo costs a second, not a 45-second engine start.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from .inputs import input_checks, modelfiles, models, profiles
from .inputs.prompts import SOURCES as _PROMPT_SOURCES
from .knobs import connector as kv_connector
from .knobs import release
from .knobs import spec as knob_spec
from .paths import DEFAULT_DRAFTER, DEFAULT_TARGET, portable, resolve

ROLES = ("p", "d", "baseline")
SWEEP_NUM_PROMPTS = 64  # a sweep point's prompts unless --prompts or its config file say otherwise


class ConfigError(ValueError):
    """A bad configuration value; the message names the value and what is allowed."""


def profile_runner(profile: str) -> str:
    """The model runner a profile's runs take: its own where the installed vLLM has it, else
    the one it has (``release.runner_for``: 0.34.0 has only MRV2)."""
    return release.runner_for(profiles.get(profile).runner)


@dataclass
class ExperimentConfig:
    """One experiment: a model pair, the servers' shape, the prompts and the knob values.

    Fields that change the servers (models, k, block size, transfer) need a restart;
    the rest apply to the next run on the same servers.
    """

    # Paths: absolute here; recorded relative to the repository root when inside it (to_dict)
    target: str = str(DEFAULT_TARGET)
    drafter: str = str(DEFAULT_DRAFTER)
    profile: str = "cpu"
    num_prompts: int = 16
    max_tokens: int = 64
    prompt_set: str = "indomain"
    prompt_file: str | None = None  # a JSONL of {"text": ...} or {"prompt_token_ids": [...]}
    k_p: int = 1  # P's num_speculative_tokens (vLLM's PD acceptance test uses 1)
    k_d: int = 3  # D's and the baseline's num_speculative_tokens
    block_size: int = 32  # CPU attention needs a multiple of 32
    kv_cache_bytes: int = 256 * 2**20
    max_model_len: int = 1024
    seed: int = 0
    knobs: dict[str, str] = field(default_factory=knob_spec.defaults)
    run_baseline: bool = True
    run_pd: bool = True
    host: str = "127.0.0.1"
    allow_remote: bool = False  # True: a host other than loopback is allowed (exposes the servers)
    ports: dict[str, int] = field(default_factory=dict)  # role -> port; unset roles get a free one
    label: str = ""  # a name for the run in tables and figures
    require_models: bool = True  # False only to print a plan for models not on this machine
    startup_timeout_s: float = 300.0
    # None: the profile's (True: vLLM's reference test flags). False lets vLLM compile graphs
    # and lets Model Runner V2 (GPU) run its start-up warm-up, the source dirty_source=warmup reads.
    enforce_eager: bool | None = None
    request_timeout_s: float = 300.0
    # Requests in flight on each side at once (each response carries its own spec-decode
    # counts). docs/measurement.md#concurrency gives the measurement behind the default.
    concurrency: int = 32
    # Capture every KV layer's blocks per request on P, D and the baseline and compare them
    # (knobs/kv_probe.py, measuring/kv_compare.py); carried as the knob kv_probe.
    kv_probe: bool = False
    # vLLM's token budget per scheduler step (--max-num-batched-tokens): one for every server,
    # or role -> tokens (unset roles keep vLLM's default); None: vLLM's default. A budget below
    # a prompt's length splits its prefill into chunks, deterministically; {"p": 64, "d": 64}
    # chunks P's prefill while the baseline stays an unchunked reference.
    max_num_batched_tokens: int | dict[str, int] | None = None
    # False passes disable_padded_drafter_batch in the speculative config: the drafter then
    # takes its next tokens on the CPU path (prepare_next_token_ids_cpu), and vLLM turns
    # asynchronous scheduling off.
    padded_drafter_batch: bool = True

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        _check_types(self)
        _localise(self)
        if self.require_models:
            _check_models(self)
        if self.profile not in profiles.PROFILES:
            raise ConfigError(f"profile {self.profile!r} is unknown; allowed: "
                              f"{', '.join(profiles.PROFILES)}")
        if self.prompt_set not in _PROMPT_SOURCES and self.prompt_file is None:
            raise ConfigError(
                f"prompt set {self.prompt_set!r} is unknown; allowed: {', '.join(_PROMPT_SOURCES)} "
                "(or pass prompt_file)"
            )
        _check_integers(self)
        if profiles.PROFILES[self.profile].device == "cpu" and self.block_size % 32:
            raise ConfigError(
                f"block_size={self.block_size}: the CPU attention backend needs a multiple of 32"
            )
        _check_ports(self)
        _check_host(self)
        if self.enforce_eager not in (None, True, False):
            raise ConfigError(f"enforce_eager={self.enforce_eager!r} must be true, false or null "
                              "(null: the profile's)")
        if not (self.run_baseline or self.run_pd):
            raise ConfigError("run_baseline and run_pd are both False: nothing to run")
        _check_budget(self)
        if not isinstance(self.kv_probe, bool):
            raise ConfigError(f"kv_probe={self.kv_probe!r} must be true or false")
        if not isinstance(self.knobs, dict):
            raise ConfigError(f"knobs={self.knobs!r} must be an object of knob name -> value")
        try:
            self.knobs = knob_spec.validate(dict(self.knobs))
            kv_connector.check(self.knobs, profiles.PROFILES[self.profile].device)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        self.knobs["kv_probe"] = "on" if self.kv_probe else "off"  # the field decides
        try:  # what the fields point to: the prompt file, the models' config.json
            input_checks.check(self)
        except input_checks.InputError as e:
            raise ConfigError(str(e)) from None

    # Fields that, when different, need different servers (with the role's own k, ROLE_K).
    SERVER_FIELDS = ("target", "drafter", "profile", "block_size",
                     "kv_cache_bytes", "max_model_len", "host", "seed", "enforce_eager",
                     "padded_drafter_batch")
    # Each server's num_speculative_tokens: P drafts k_p, D and its reference k_d.
    ROLE_K = {"p": "k_p", "d": "k_d", "baseline": "k_d"}

    def k(self, role: str) -> int:
        return getattr(self, self.ROLE_K[role])

    def enforce_eager_in_force(self) -> bool:
        """``--enforce-eager`` as the servers get it: the profile's unless overridden."""
        if self.enforce_eager is None:
            return profiles.PROFILES[self.profile].enforce_eager
        return self.enforce_eager

    def roles(self) -> list[str]:
        """The servers this config needs, in start order."""
        return (["p", "d"] if self.run_pd else []) + (["baseline"] if self.run_baseline else [])

    def server_key(self, role: str) -> tuple[Any, ...]:
        """What, when different, needs another server for ``role``: the server fields, the
        restart-time knobs that act on the role (``KnobSpec.roles``) and the role's port."""
        restart = tuple(self.knobs[n] for n in knob_spec.restart_knobs(role))
        return (*(getattr(self, f) for f in self.SERVER_FIELDS), self.k(role), *restart,
                self.budget(role), self.ports.get(role))

    def budget(self, role: str) -> int | None:
        """``role``'s ``--max-num-batched-tokens`` (None: vLLM's default)."""
        v = self.max_num_batched_tokens
        return v.get(role) if isinstance(v, dict) else v

    @classmethod
    def for_profile(cls, profile: str, **overrides: Any) -> ExperimentConfig:
        """A config with the profile's defaults (models, block size, prompts, tokens, the
        knob ``runner``; knobs given in ``overrides`` win)."""
        try:
            prof = profiles.get(profile)
        except ValueError as e:
            raise ConfigError(str(e)) from None
        data: dict[str, Any] = {"profile": profile, "block_size": prof.block_size,
                                "prompt_set": prof.default_prompt_set,
                                "max_tokens": prof.default_max_tokens,
                                "max_model_len": prof.max_model_len}
        if prof.default_target:
            data["target"] = prof.default_target
            data["drafter"] = prof.default_drafter
        knobs = overrides.pop("knobs", {})
        data.update(overrides)
        # a knobs value that is no object reaches validate(), which names what is wrong
        runner = profile_runner(profile)
        data["knobs"] = {"runner": runner, **knobs} if isinstance(knobs, dict) else knobs
        return cls.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        """The config as records keep it: paths inside the repository relative to its root."""
        data = asdict(self)
        for name in PATH_FIELDS:
            if data[name] is not None and not models.is_hub_id(data[name]):
                data[name] = portable(data[name])
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ExperimentConfig:
        if not isinstance(data, dict):
            raise ConfigError(f"config must be a JSON object, got {type(data).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown config keys {unknown}; allowed: {sorted(known)}")
        return cls(**data)

    @classmethod
    def from_json(cls, path: str | Path) -> ExperimentConfig:
        return cls.from_dict(read_json(path))


def read_json(path: str | Path) -> Any:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r} does not exist") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"config file {str(path)!r} is not valid JSON: {e}") from None


# --- field checks (each names the value and what is allowed) ---------------------------------
PATH_FIELDS = ("target", "drafter", "prompt_file")


def local_path(value: str) -> str:
    """A path field on this machine: absolute as given; relative to the working directory
    where it exists there, else to the repository root (as records write it); a Hugging Face
    id that is neither stays an id."""
    p = Path(value).expanduser()
    if p.is_absolute():
        return str(p)
    if p.exists():
        return str(p.absolute())
    if models.is_hub_id(value) and not resolve(value).exists():
        return value
    return str(resolve(value))


def _localise(cfg: ExperimentConfig) -> None:
    for name in PATH_FIELDS:
        if (v := getattr(cfg, name)) is not None:
            setattr(cfg, name, local_path(v))


_STR_FIELDS = ("target", "drafter", "profile", "prompt_set", "host", "label")
_BOOL_FIELDS = ("run_baseline", "run_pd", "require_models", "allow_remote",
                "padded_drafter_batch")
# integer fields and their least value: a bool is not an integer here (True would be k=1)
_INT_FIELDS = {"k_p": 1, "k_d": 1, "num_prompts": 1, "max_tokens": 1, "concurrency": 1,
               "block_size": 1, "kv_cache_bytes": 1, "max_model_len": 1, "seed": 0}
LOOPBACK_NAMES = ("localhost",)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_types(cfg: ExperimentConfig) -> None:
    for name in _STR_FIELDS:
        v = getattr(cfg, name)
        if not isinstance(v, str) or (name == "host" and not v):
            raise ConfigError(f"{name}={v!r} must be a non-empty string" if name == "host"
                              else f"{name}={v!r} must be a string")
    if cfg.prompt_file is not None and not isinstance(cfg.prompt_file, str):
        raise ConfigError(f"prompt_file={cfg.prompt_file!r} must be a path string or null")
    for name in _BOOL_FIELDS:
        v = getattr(cfg, name)
        if not isinstance(v, bool):
            raise ConfigError(f"{name}={v!r} must be true or false")
    for name in ("startup_timeout_s", "request_timeout_s"):
        v = getattr(cfg, name)
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not v > 0:
            raise ConfigError(f"{name}={v!r} must be a number of seconds > 0")


def _check_integers(cfg: ExperimentConfig) -> None:
    for name, least in _INT_FIELDS.items():
        v = getattr(cfg, name)
        if not _is_int(v) or v < least:
            what = " (the number of draft tokens)" if name in ("k_p", "k_d") else ""
            raise ConfigError(f"{name}={v!r}{what} must be an integer >= {least}")


def _check_budget(cfg: ExperimentConfig) -> None:
    """``max_num_batched_tokens``: null (vLLM's default), a whole number of tokens >= 1, or an
    object of role -> such a number."""
    v = cfg.max_num_batched_tokens
    per_role = v if isinstance(v, dict) else {"every role": v}
    for role, n in per_role.items():
        if role != "every role" and role not in ROLES:
            raise ConfigError(f"max_num_batched_tokens: unknown role {role!r}; allowed: "
                              f"{', '.join(ROLES)}")
        if n is not None and (not _is_int(n) or n < 1):
            raise ConfigError(f"max_num_batched_tokens={v!r}: {role} must get an integer >= 1 "
                              "(tokens per scheduler step), or null for vLLM's default")


def _check_models(cfg: ExperimentConfig) -> None:
    """Each model is a directory with a config.json or a Hugging Face id (downloaded before
    servers start, ``models.fetch``); two local directories: the target has a tokenizer and
    the drafter's config fits the target's (``modelfiles.check_pair``)."""
    for name in ("target", "drafter"):
        if (why := models.problem(str(getattr(cfg, name)))) is not None:
            raise ConfigError(f"{name} model {why}")
    if models.is_hub_id(str(cfg.target)) or models.is_hub_id(str(cfg.drafter)):
        return  # checked once downloaded: the servers' own load says what does not fit
    try:
        modelfiles.check_pair(Path(cfg.target).expanduser(), Path(cfg.drafter).expanduser())
    except modelfiles.ModelFilesError as e:
        raise ConfigError(str(e)) from None


def _check_ports(cfg: ExperimentConfig) -> None:
    if not isinstance(cfg.ports, dict):
        raise ConfigError(f"ports={cfg.ports!r} must be an object of role -> port, e.g. "
                          '{"p": 8100, "d": 8200}; allowed roles: ' + ", ".join(ROLES))
    seen: dict[int, str] = {}
    for role, port in cfg.ports.items():
        if role not in ROLES:
            raise ConfigError(f"ports: unknown role {role!r}; allowed: {', '.join(ROLES)}")
        if not _is_int(port) or not 0 < port < 65536:
            raise ConfigError(f"ports[{role!r}]={port!r} must be an integer in 1..65535")
        if port in seen:
            raise ConfigError(f"ports: {seen[port]} and {role} both ask for port {port}; each "
                              "role needs its own port")
        seen[port] = role


def is_loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_host(cfg: ExperimentConfig) -> None:
    """Servers bind where ``host`` says, and NIXL's side channel follows: anything but
    loopback needs an explicit ``allow_remote`` (``--allow-remote``)."""
    if cfg.allow_remote or is_loopback(cfg.host):
        return
    raise ConfigError(
        f"host={cfg.host!r} is not a loopback address: P, D and the baseline (their "
        "unauthenticated OpenAI and dev-mode endpoints) and NIXL's side channel on P and D "
        "would accept connections from other machines; allowed: 127.0.0.1 (or any 127.x, ::1, "
        "localhost), or pass --allow-remote (allow_remote=True) to expose them on purpose")


def exposure_notes(cfg: ExperimentConfig) -> list[str]:
    """The one note a result gets when its servers were bound beyond loopback."""
    if is_loopback(cfg.host):
        return []
    return [f"servers bound to {cfg.host} (--allow-remote): P's, D's and the baseline's HTTP "
            "endpoints (dev mode included: /reset_prefix_cache, /collective_rpc) and NIXL's side "
            "channel on P and D (KV blocks) were reachable from other machines, with no "
            "authentication"]
