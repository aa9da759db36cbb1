"""The knob ``connector`` without servers: its table, the refusals (by name, with the source's
reason, before any server starts), which knobs act through which connector, the proxy's flow
per connector, ``check --connector`` planning and the connector x finding table."""

from __future__ import annotations

import json

import pytest

from workbench.config import ConfigError, ExperimentConfig
from workbench.findings import FINDINGS, check, connector_table
from workbench.knobs import connector as kv_connector
from workbench.knobs import spec
from workbench.notebook import sweep
from workbench.serving import proxy
from workbench.serving.plan import server_specs


def test_the_knob_values_are_the_connector_table():
    assert spec.KNOBS["connector"].values == tuple(kv_connector.CONNECTORS)
    assert spec.KNOBS["connector"].default == "nixl"
    assert spec.KNOBS["connector"].restart and spec.KNOBS["connector"].roles == ("p", "d")
    assert kv_connector.runs_on_cpu() == ("nixl", "nixl-push", "example", "multi")


@pytest.mark.parametrize("name", ["offloading", "lmcache"])
def test_a_connector_the_cpu_cannot_run_is_refused_by_name_with_the_source(name):
    with pytest.raises(ConfigError) as e:
        ExperimentConfig(knobs={"connector": name})
    msg = str(e.value)
    assert f"connector={name!r} cannot run on the CPU" in msg and ".py: " in msg
    assert "connectors that run here: nixl, nixl-push, example, multi" in msg
    ExperimentConfig.for_profile("gpu", knobs={"connector": name})  # a GPU takes it


def test_mooncake_is_refused_everywhere_naming_the_flow_it_lacks():
    for profile in ("cpu", "gpu"):
        with pytest.raises(ConfigError, match="connector='mooncake' is not supported by the "
                                              "workbench: its proxy flow is not built"):
            ExperimentConfig.for_profile(profile, knobs={"connector": "mooncake"})


@pytest.mark.parametrize(("knob", "value"), [("block_handoff", "legacy"),
                                             ("transfer", "host-staged")])
def test_a_knob_that_cannot_act_through_the_connector_is_refused(knob, value):
    with pytest.raises(ConfigError, match=f"knob {knob}='{value}' does not act through "
                                          "connector='example'"):
        ExperimentConfig(knobs={"connector": "example", knob: value})
    ExperimentConfig(knobs={"connector": "nixl-push", knob: value})  # NIXL: it acts


@pytest.mark.parametrize("name", kv_connector.runs_on_cpu())
def test_each_connector_s_servers(name, tmp_path):
    cfg = ExperimentConfig(knobs={"connector": name})
    specs = {s.role: s for s in server_specs(cfg, tmp_path)}
    conn = kv_connector.get(name)
    for role in ("p", "d"):
        cmd = specs[role].command()
        kv = json.loads(cmd[cmd.index("--kv-transfer-config") + 1])
        assert kv["kv_connector"] == conn.classes[0]
        assert (specs[role].side_channel_port is not None) == conn.nixl
        assert specs[role].env()[spec.ENV_CONNECTOR] == name
    assert "--kv-transfer-config" not in specs["baseline"].command()


def test_the_proxy_drives_each_flow_as_vllms_examples_do():
    body = {"prompt": [1, 2, 3], "max_tokens": 8}
    p = proxy.prefill_request(body)
    assert p["max_tokens"] == 1 and p["kv_transfer_params"]["do_remote_decode"]
    with pytest.raises(RuntimeError, match="no kv_transfer_params"):
        proxy.decode_request(body, {})
    assert proxy.decode_request(body, {"kv_transfer_params": {"x": 1}})[
        "kv_transfer_params"] == {"x": 1}
    same = kv_connector.SAME_PROMPT
    assert "kv_transfer_params" not in proxy.prefill_request(body, same)
    assert proxy.decode_request(body, {}, same) == body


def test_the_built_classes_read_back_as_the_knob_value():
    assert kv_connector.named(("NixlPullConnector",)) == "nixl"
    assert kv_connector.named(("NixlPushConnector",)) == "nixl-push"
    assert kv_connector.named(("MultiConnector", "NixlPullConnector", "ExampleConnector")) == (
        "multi")
    assert kv_connector.named(("SomethingElse",)) is None


def test_check_plans_per_connector_and_says_why_a_finding_does_not_apply():
    _, uses, skipped = check.plan(check.select(None), check.connector_base("cpu", "example"),
                                  attached=False)
    assert set(uses) == {"padded-load-step", "chunked-prefill-drafter-kv",
                         "example-chunked-store"}
    assert skipped["nixl-cpu-forward-thread"][1].startswith("applies to connector nixl, ")
    assert "does not act through connector='example'" in skipped["unclipped-handoff"][1]
    order, uses, skipped = check.plan(check.select(None),
                                      check.connector_base("cpu", "nixl-push"), False)
    # prefix-cache-drafter-kv: measured through NIXL pull only so far
    assert set(skipped) == {"example-chunked-store", "prefix-cache-drafter-kv"}
    assert set(uses) == set(FINDINGS) - set(skipped)
    assert all(cfg.knobs["connector"] == "nixl-push" for _, cfg in order)


@pytest.mark.parametrize(("name", "why"), [("offloading", "cannot run on the CPU"),
                                           ("mooncake", "not supported by the workbench"),
                                           ("bogus", "no such connector; known: nixl, ")])
def test_check_refuses_a_connector_before_any_server_starts(name, why):
    with pytest.raises(ConfigError, match=why):
        check.connector_base("cpu", name)


def test_expectations_per_connector(tmp_path):
    f = tmp_path / "e.json"
    f.write_text(json.dumps({"findings": {"a": "present"}, "optional": ["b"],
                             "connectors": {"example": {"findings": {"a": "absent"}}}}))
    assert check.expectations(f, "x")[1]["findings"] == {"a": "present"}
    assert check.expectations(f, "x", "example")[1]["findings"] == {"a": "absent"}
    # a file given with --expect and no entry for the connector: its own findings, not none
    assert check.expectations(f, "x", "multi")[1]["findings"] == {"a": "present"}
    assert check.expectations(f, "x", "multi", "v2")[1]["findings"] == {"a": "present"}
    # the committed file of a table entry: a connector it has no entry for expects nothing
    assert check.expectations(None, "0.32.0", "nixl-push")[1]["findings"]
    committed = json.loads((check.EXPECTED / "expected-0.33.0.json").read_text())
    assert "connectors" not in committed
    assert check.expectations(None, "0.33.0", "multi")[1]["findings"] == {}


def _doc(connector: str, verdicts: dict[str, str]) -> dict:
    return {"connector": connector, "command": f"python -m workbench check --connector "
            f"{connector}", "created": "2026-12-03T00:00:00+00:00", "build": {"version": "0.32.0"},
            "ok": True, "findings": [
                {"id": i, "verdict": v, "expected": v, "seconds": 1.0,
                 "evidence": {"why": "it needs NIXL"} if v == "not-applicable" else {}}
                for i, v in verdicts.items()]}


def test_the_connector_table_shows_every_finding_and_why_not_and_rewrites_its_block(tmp_path):
    for c, v in (("nixl", "present"), ("example", "not-applicable")):
        (tmp_path / c).mkdir()
        (tmp_path / c / "check.json").write_text(json.dumps(
            _doc(c, {"padded-load-step": v})))
    docs = connector_table.load([tmp_path / "nixl", tmp_path / "example"])
    table = connector_table.markdown(docs)
    assert table.splitlines()[0] == "| finding | `nixl` | `example` |"
    assert "| `padded-load-step` | **present** | n/a |" in table
    assert "| `stale-last-block` | not run | not run |" in table
    assert "- `padded-load-step` on `example`: it needs NIXL" in table
    page = tmp_path / "page.md"
    page.write_text("# Title\n\ntext\n")
    connector_table.write_into(page, "T1")
    connector_table.write_into(page, "T2")
    text = page.read_text()
    assert text.count(connector_table.BEGIN) == 1 and "T2" in text and "T1" not in text
    assert text.startswith("# Title\n\ntext\n")


def test_a_point_recorded_before_a_knob_existed_reads_it_at_its_default():
    new = {k: v for k, v in spec.defaults().items()}
    old = {k: v for k, v in new.items() if k != "connector"}
    rec = {"config": {"knobs": old}, "vllm_version": "0.32.0", "models": {}}
    assert sweep.differences(rec, {"config": {"knobs": new}, "vllm_version": "0.32.0",
                                   "models": {"target": {}, "drafter": {}}}) == [
        "model files of the target: None -> {}", "model files of the drafter: None -> {}"]
    assert sweep.with_new_knobs(rec)["config"]["knobs"] == new


# --- finding example-chunked-store: the detector on rows shaped as the KV probe writes them --
def test_never_computed_is_the_stored_tail_past_the_first_chunk():
    from workbench.findings.example_chunked_store import never_computed

    assert never_computed([96, 47], 143, 32, 1) == set(range(96, 128))  # 128 stored, 96 done
    assert never_computed([143], 143, 32, 1) == set()  # not chunked
    assert never_computed([96, 25], 121, 32, 1) == set()  # 96 stored, all computed
    assert never_computed([96, 33], 129, 32, 1) == set()  # D's lookup names another folder
    assert never_computed([64, 79], 143, 32, 1) == set()  # 96 slots < 128 stored: D fails


def test_example_chunked_store_detector():
    from test_host_buffer_chunk_boundary import result, row

    from workbench.findings.example_chunked_store import detect
    from workbench.findings.finding import ABSENT, INCONCLUSIVE, PRESENT

    window = set(range(96, 128))
    assert detect(result(row([96, 47], 143, window), row([68], 68, None)))[0] == PRESENT
    assert detect(result(row([96, 47], 143, window | {3})))[0] == INCONCLUSIVE
    assert detect(result(row([96, 47], 143, None)))[0] == ABSENT  # a fixed connector
    assert detect(result(row([68], 68, None)))[0] == INCONCLUSIVE  # nothing chunked


def test_the_example_report_reproduces_through_the_connector_s_own_flow():
    """The committed example-chunked-store run's standalone script drives P then D with the
    same prompt (no kv_transfer_params) over one shared storage folder it makes at start, and
    the report's command names the connector."""
    from workbench.findings import report
    from workbench.paths import DATA

    res = json.loads((DATA / "connectors" / "check-example" / "runs" /
                      "example-chunked-store-main" / "result.json").read_text())
    cfg = ExperimentConfig.from_dict(res["config"])
    script = report.standalone(FINDINGS["example-chunked-store"], cfg, res)
    assert "FLOW = 'same-prompt'" in script and script.count("{storage}") == 2
    assert "PLUGIN_ENV = {}" in script  # vLLM alone shows it
    assert report.connector_flag(cfg) == " --connector example"
    assert report.connector_flag(ExperimentConfig()) == ""


def test_the_example_script_shows_the_loud_half_last(tmp_path):
    """After the run's prompts (the silent half: D loads positions P never computed), the
    script sends one 192-token prompt, which P at 96 tokens a step stores short of its aligned
    length, and says D failed on it (issue #16928's crash); D's failure is caught, not raised."""
    import runpy

    import httpx

    from workbench.findings import report
    from workbench.paths import DATA

    res = json.loads((DATA / "connectors" / "check-example" / "runs" /
                      "example-chunked-store-main" / "result.json").read_text())
    cfg = ExperimentConfig.from_dict(res["config"])
    path = tmp_path / "repro.py"
    path.write_text(report.standalone(FINDINGS["example-chunked-store"], cfg, res))
    ns = runpy.run_path(str(path))
    assert ns["LOUD"] == 192
    sent = []

    def complete(url, model, prompt, rid, **extra):
        sent.append((url, len(prompt), extra, prompt))
        if url == "d":
            raise httpx.HTTPStatusError("500", request=httpx.Request("POST", url),
                                        response=httpx.Response(500))
        return {}

    ns["loud"].__globals__["complete"] = complete
    said = ns["loud"]({"p": "p", "d": "d"}, "target")
    assert said.startswith("loud half: D failed on a 192-token prompt (HTTPStatusError")
    assert [(u, n, x) for u, n, x, _ in sent] == [
        ("p", 192, {"max_tokens": 1}), ("d", 192, {})]  # the plain prompt to both
    # no full block of it starts as an earlier prompt does: P would find it in its prefix cache
    first = sent[0][3][:32]
    assert all(q[:32] != first for q in ns["PROMPTS"])
