"""Preflight against a real S3 server behind a proxy that ignores Range: exactly the storage rows fail."""

import json


def test_preflight_storage_rows_fail_on_a_store_that_ignores_range(make_backend, make_config, baton_cli, tmp_path):
    backend = make_backend("s3")
    backend.fault("ignore_range", match=lambda method, path: method == "GET")
    out = tmp_path / "pf"
    p = baton_cli("preflight", "-c", str(make_config()), "--out", str(out), "--stages", "construct,data,storage",
                  "--store", backend.url)
    doc = json.loads((out / "preflight.json").read_text())
    assert p.returncode == 1 and doc["verdict"] == "FAIL"
    results = {r["requirement"]: r["result"] for r in doc["scorecard"]}
    failed = sorted(k for k, v in results.items() if v == "fail")
    assert failed == sorted([
        "Checkpoint push proven by the store (listing + ranged read-back), pointer read back, then prune",
        "Cold pull from the store into an empty folder, sha-verified",
    ])
    assert all(results[k] == "pass" for k in results if k.startswith(("The training code", "Data bytes", "Resumption")))
    report = (out / "report.md").read_text()
    assert "not 206" in report or "Content-Range" in report  # the verifier's reason reaches the report
