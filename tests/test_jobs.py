"""distrl.cluster.jobs pieces that need no cluster: the entrypoint, fetching, copying from the head."""

import io
import json
import tarfile

import pytest

from distrl.cluster import jobs


def test_entrypoint_is_the_training_command_quoted():
    cmd = jobs.training_entrypoint(["--env", "CartPole-v1", "--run-id", "a b"], "/runs/x y")
    assert cmd == ("python -m distrl.apex.train --env CartPole-v1 --run-id 'a b' --progress false "
                   "--output-dir '/runs/x y'")
    with pytest.raises(ValueError, match="must not contain --output-dir"):
        jobs.training_entrypoint(["--output-dir", "elsewhere"], "/runs/x")


def test_fetch_copies_results_and_checkpoints_from_a_uri(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "results.json").write_text(json.dumps({"env_steps": 5}))
    (run / "checkpoints" / "checkpoint-000000007.npz").write_bytes(b"npz")
    (run / "checkpoints" / "checkpoint-000000007.json").write_text("{}")
    local = jobs.fetch(f"file://{run}", tmp_path / "local")
    assert json.loads((local / "results.json").read_text()) == {"env_steps": 5}
    assert sorted(p.name for p in (local / "checkpoints").iterdir()) == [
        "checkpoint-000000007.json", "checkpoint-000000007.npz"]
    with pytest.raises(FileNotFoundError, match="has the job ended"):
        jobs.fetch(str(tmp_path / "nothing"), tmp_path / "local2")


def test_copy_from_head_streams_a_tar_from_the_head_pod(stand_ins, tmp_path):
    remote = tmp_path / "pod" / "job"
    (remote / "tb").mkdir(parents=True)
    (remote / "results.json").write_text('{"env_steps": 5}')
    (remote / "tb" / "events").write_bytes(b"\x00" * 1000)
    local = jobs.copy_from_head(str(remote), tmp_path / "job", context="gke_p_z_c",
                                namespace="rl")
    assert json.loads((local / "results.json").read_text()) == {"env_steps": 5}
    assert (local / "tb" / "events").stat().st_size == 1000
    assert stand_ins() == [
        ["kubectl", "--context=gke_p_z_c", "get", "pods", "--namespace=rl",
         "--selector=ray.io/node-type=head", "--output=jsonpath={.items[0].metadata.name}"],
        ["kubectl", "--context=gke_p_z_c", "exec", "--namespace=rl", "distrl-head-x7k2p",
         "--container=ray-head", "--", "tar", "cf", "-", "-C", str(remote), "."]]


def test_copy_from_head_reports_a_failing_kubectl(stand_ins, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_FAIL", "exec --namespace")
    with pytest.raises(RuntimeError, match="kubectl --context=gke_p_z_c exec .* failed: ERROR"):
        jobs.copy_from_head("/x", tmp_path / "job", context="gke_p_z_c")


def _tar(*members) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for info, data in members:
            archive.addfile(info, io.BytesIO(data) if data is not None else None)
    buffer.seek(0)
    return buffer


def _member(name, data=b"x", **fields):
    info = tarfile.TarInfo(name)
    info.size = len(data) if fields.get("type", tarfile.REGTYPE) == tarfile.REGTYPE else 0
    for key, value in fields.items():
        setattr(info, key, value)
    return info, data if info.size else None


@pytest.mark.parametrize("member, error", [
    (_member("../escape"), tarfile.OutsideDestinationError),
    (_member("link", type=tarfile.SYMTYPE, linkname="/etc/passwd"), tarfile.AbsoluteLinkError),
    (_member("link", type=tarfile.SYMTYPE, linkname="../../x"), tarfile.LinkOutsideDestinationError),
    (_member("dev", type=tarfile.CHRTYPE, devmajor=1, devminor=3), tarfile.SpecialFileError),
])
def test_an_archive_from_the_pod_cannot_write_outside_the_destination(tmp_path, member, error):
    destination = tmp_path / "out"
    destination.mkdir()
    with pytest.raises(error):
        jobs.unpack_tar(_tar(_member("ok.json", b"{}"), member), destination)
    assert (destination / "ok.json").read_bytes() == b"{}"  # what came before is kept
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["ok.json", "out"]


def test_an_archive_past_the_size_or_file_limits_is_refused(tmp_path):
    with pytest.raises(ValueError, match="more than 2 files"):
        jobs.unpack_tar(_tar(*[_member(f"f{i}") for i in range(3)]), tmp_path, max_files=2)
    with pytest.raises(ValueError, match="more than 10 bytes"):
        jobs.unpack_tar(_tar(_member("big", b"y" * 11)), tmp_path / "b", max_bytes=10)
    assert jobs.unpack_tar(_tar(_member("a/b.txt", b"hi")), tmp_path / "c") == 1
    jobs.unpack_tar(_tar(_member("/etc/evil", b"e")), tmp_path / "abs")  # lands inside
    assert (tmp_path / "abs" / "etc" / "evil").read_bytes() == b"e"
    set_uid = _member("tool", b"#!", mode=0o4755)
    jobs.unpack_tar(_tar(set_uid), tmp_path / "d")
    assert (tmp_path / "d" / "tool").stat().st_mode & 0o4000 == 0


def test_notebook_04_starts_no_paid_pong_run_unless_asked():
    """The parameters cell's PONG runs at most a smoke job of minutes, on either cluster; the
    hours-long workload needs PONG = "full", and only on GKE."""
    import ast
    import shlex

    from distrl.apex.train import build_parser
    from distrl.gke.settings import NODE_READY_S, REPO_ROOT, WORKLOADS

    cells = json.loads((REPO_ROOT / "notebooks" / "04-distributed-training.ipynb").read_text())
    [params] = [c for c in cells["cells"] if "parameters" in c["metadata"].get("tags", [])]
    values = {node.targets[0].id: ast.literal_eval(node.value)
              for node in ast.parse("".join(params["source"])).body}
    # "auto": the smoke job on GKE (and in CI's SMOKE run), none here (the notebook's rule)
    assert values["PONG"] == "auto"
    assert jobs.pong_job_args("off", "local") is None
    for cluster in ("local", "gke"):  # the smoke job, wherever it runs
        args = jobs.pong_job_args("smoke", cluster)
        config = build_parser().parse_args(args)
        assert config.max_seconds <= jobs.PONG_SMOKE_SECONDS + NODE_READY_S
        assert config.max_learner_updates == 1 and config.num_actors == 1
    # The full run goes only to the pool that notebook 03 makes (and prices) for Pong: the
    # live RayCluster's spec, as kubectl gives it back (quantities written as the API server
    # writes them), is compared part by part with the planned one.
    import copy

    from distrl.gke import manifests
    from distrl.gke.settings import GkeSettings

    planned = jobs.pong_pool_spec()
    live = json.loads(json.dumps(planned))  # kubectl's JSON: strings for quantities
    head = live["headGroupSpec"]["template"]["spec"]["containers"][0]["resources"]
    head["requests"] = {k: str(v) for k, v in head.get("requests", {}).items()}
    full = jobs.pong_job_args("full", "gke", live)
    assert shlex.join(WORKLOADS["pong"].command_args()) in shlex.join(full)
    assert full[full.index("--num-actors") + 1] == "12" and full[full.index("--num-gpus") + 1] == "1"
    assert jobs.pool_differences(live, planned) == []
    from distrl.gke.settings import parse_quantity as q

    assert q("500m") == 0.5 and q("30Gi") == 30 * 2**30 == q(str(30 * 2**30)) and q(8) == q("8")
    with pytest.raises(ValueError, match=r"quantity '3 cores' is invalid: expected a number"):
        q("3 cores")

    def cluster_of(workload: str, **settings) -> dict:
        return manifests.ray_cluster_spec(GkeSettings.for_workload(
            workload, project_id="any-project", **settings))

    # CartPole's pool (24 actors on 4 nodes), a T4 head, Autopilot: each refused, naming what
    # differs; one changed node count too.
    for other, words in [(cluster_of("cartpole"), "maxReplicas"),
                         (cluster_of("pong", gpu_type="nvidia-tesla-t4"), "head requests.memory"),
                         (cluster_of("pong", mode="autopilot"), "head")]:
        with pytest.raises(ValueError, match=rf"differs: .*{words}.*create the cluster with "
                                             r"WORKLOAD = 'pong'"):
            jobs.pong_job_args("full", "gke", other)
    # The Pong pool of a cluster made with another PREFIX, or on Autopilot, is Pong's pool:
    # the reader's settings (read from the kube context) render the plan it is compared with.
    for context in ("gke_demo-project-1_europe-west4-b_rl-cluster",
                    "gke_demo-project-1_us-central1_distrl-cluster"):
        theirs = GkeSettings.from_kube_context(context, "pong")
        live = json.loads(json.dumps(jobs.pong_pool_spec(theirs)))
        assert jobs.pong_job_args("full", "gke", live, theirs)[:2] == ["--env", "ALE/Pong-v5"]
    with pytest.raises(ValueError, match=r"kube context 'minikube' is not one the plan writes"):
        GkeSettings.from_kube_context("minikube", "pong")
    more = copy.deepcopy(planned)
    more["workerGroupSpecs"][0]["maxReplicas"] += 1
    with pytest.raises(ValueError, match=r"maxReplicas: live 3, planned 2"):
        jobs.pong_job_args("full", "gke", more)
    with pytest.raises(ValueError, match="PONG='full' is the workload's run on GKE"):
        jobs.pong_job_args("full", "local")
    with pytest.raises(ValueError, match="PONG='full' is the workload's run on GKE"):
        jobs.pong_job_args("full", "gke")  # no live spec to compare
    with pytest.raises(ValueError, match="PONG=True: expected one of 'smoke', 'full', 'off'"):
        jobs.pong_job_args(True, "local")
    with pytest.raises(ValueError, match="cluster='kind': expected 'local' or 'gke'"):
        jobs.pong_job_args("smoke", "kind")
    assert jobs.pong_job_args("off", "gke") is None
