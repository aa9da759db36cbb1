"""Bad input gets a clear error naming the value, before any server starts."""

import json
import socket

import pytest

from workbench import cli
from workbench.config import ConfigError, ExperimentConfig, exposure_notes
from workbench.knobs import spec as knob_spec
from workbench.serving import servers


@pytest.fixture
def no_server_may_start(monkeypatch):
    def boom(self):
        raise AssertionError(f"a {self.spec.role} server was started despite bad input")

    monkeypatch.setattr(servers.VllmServer, "start", boom)


def run_cli(args, capsys):
    code = cli.main(["run", "--out", "/tmp/never-written", *args])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--target", "/no/such/model"], "/no/such/model"),
        (["--drafter", "/no/such/drafter"], "/no/such/drafter"),
        (["--k-d", "0"], "k_d=0"),
        (["--k-p", "-1"], "k_p=-1"),
        (["--prompt-set", "nosuchset"], "'nosuchset'"),
        (["--knob", "finalize=sometimes"], "'sometimes'"),
        (["--knob", "frobnicate=on"], "'frobnicate'"),
        (["--knob", "finalize"], "NAME=VALUE"),
        (["--block-size", "16"], "block_size=16"),
        (["--config", "/no/such/config.json"], "/no/such/config.json"),
    ],
)
def test_bad_input_is_refused_early(args, needle, capsys, no_server_may_start, tiny_pair):
    target, drafter = tiny_pair
    base = ["--target", str(target), "--drafter", str(drafter)]
    code, err = run_cli(base + args, capsys)
    assert code == 2
    assert needle in err, err


def test_unknown_knob_value_lists_allowed_values():
    with pytest.raises(ValueError) as e:
        knob_spec.validate({"blocks": "clean"})
    for v in knob_spec.KNOBS["blocks"].values:
        assert v in str(e.value)


def test_malformed_config_file(tmp_path, capsys, no_server_may_start, tiny_pair):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    code, err = run_cli(["--config", str(bad)], capsys)
    assert code == 2 and str(bad) in err
    unknown = tmp_path / "unknown.json"
    unknown.write_text(json.dumps({"target": str(tiny_pair[0]), "drafter": str(tiny_pair[1]),
                                   "num_promts": 3}))
    code, err = run_cli(["--config", str(unknown)], capsys)
    assert code == 2 and "num_promts" in err


def test_port_already_taken(capsys, no_server_may_start, tiny_pair):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        target, drafter = tiny_pair
        code, err = run_cli(["--target", str(target), "--drafter", str(drafter),
                             "--prompt-set", "random", "--port-d", str(port)], capsys)
    assert code == 2
    assert str(port) in err and "already in use" in err


def test_config_round_trips_through_json(tiny_pair, tmp_path):
    cfg = ExperimentConfig(target=str(tiny_pair[0]), drafter=str(tiny_pair[1]),
                           knobs={"finalize": "eager"})
    p = tmp_path / "c.json"
    p.write_text(json.dumps(cfg.to_dict()))
    again = ExperimentConfig.from_json(p)
    assert again == cfg and again.knobs["finalize"] == "eager"
    assert again.knobs["blocks"] == "as-is"  # defaults filled in


def test_servers_bind_loopback_by_default(tiny_pair, tmp_path):
    cfg = ExperimentConfig(target=str(tiny_pair[0]), drafter=str(tiny_pair[1]))
    from workbench.serving.plan import server_specs

    for spec in server_specs(cfg, tmp_path):
        cmd = spec.command()
        assert cmd[cmd.index("--host") + 1] == "127.0.0.1"
        assert spec.env().get("VLLM_NIXL_SIDE_CHANNEL_HOST", "127.0.0.1") == "127.0.0.1"


def test_knob_defaults_are_the_fixed_behaviour():
    assert knob_spec.defaults() == {
        "finalize": "deferred", "prefill_lookahead": "default", "block_handoff": "clipped",
        "load_step": "as-released",
        "blocks": "as-is", "dirty_source": "noise", "transfer": "direct", "connector": "nixl",
        "runner": "v1", "double_bos": "off", "kv_probe": "off",
    }


def test_session_paths_are_absolute(tmp_path, monkeypatch):
    """Notebook kernels run with cwd notebooks/: a relative log dir (``make figures`` passes
    data/results) would send them to another knob-state directory than the servers'."""
    from workbench.experiment import Session

    monkeypatch.chdir(tmp_path)
    s = Session("rel/logs", baseline_cache="rel/cache")
    assert s.log_dir == tmp_path / "rel" / "logs"
    assert s.state_dir.is_absolute() and s.knobs_file.is_absolute()
    assert s.baseline_cache == tmp_path / "rel" / "cache"
    a = Session.attach({"d": "http://127.0.0.1:9"}, knobs_file="k.json", state_dir="st")
    assert a.knobs_file == tmp_path / "k.json" and a.state_dir == tmp_path / "st"


def test_cpu_profile_servers_get_the_delay_gpu_profiles_do_not(tmp_path):
    from workbench.serving.plan import server_specs

    envs = {r.role: r.env() for r in server_specs(ExperimentConfig(require_models=False), tmp_path)}
    assert envs["p"][knob_spec.ENV_NIXL_PROGRESS_DELAY_US] == "1000"
    assert envs["d"][knob_spec.ENV_NIXL_PROGRESS_DELAY_US] == "1000"
    assert knob_spec.ENV_NIXL_PROGRESS_DELAY_US not in envs["baseline"]  # no connector, no NIXL
    gpu = ExperimentConfig.for_profile("gpu", require_models=False)
    assert all(knob_spec.ENV_NIXL_PROGRESS_DELAY_US not in r.env()
               for r in server_specs(gpu, tmp_path))


def test_a_remote_host_needs_allow_remote_and_is_noted(tiny_pair, tmp_path):
    with pytest.raises(ConfigError, match="--allow-remote"):
        ExperimentConfig(require_models=False, host="0.0.0.0")
    cfg = ExperimentConfig(target=tiny_pair[0], drafter=tiny_pair[1], host="0.0.0.0",
                           allow_remote=True)
    (note,) = exposure_notes(cfg)
    assert "0.0.0.0" in note and "side channel" in note
    from workbench.serving.plan import server_specs

    for spec in server_specs(cfg, tmp_path):
        assert spec.command()[spec.command().index("--host") + 1] == "0.0.0.0"
    for host in ("127.0.0.1", "127.0.0.2", "::1", "localhost"):
        assert exposure_notes(ExperimentConfig(require_models=False, host=host)) == []
