"""Hub browsing against the stand-in Hub (tests/hub_server.py): search, listings grouped by
quantization, references, errors, offline listings and the search command."""
import json

import pytest
from hub_server import hub_server, populate  # noqa: F401 (fixture)

from llamatui.app.cli import main
from llamatui.models import hub
from llamatui.models.hub import (EntryNotFoundError, GatedRepoError, HubUnreachableError,
                                 ModelRef, RemoteFile, RepoNotFoundError, group_files, parse_ref,
                                 quant_of, shard_of)


@pytest.fixture
def hubsrv(hub_server, tmp_path, monkeypatch):
    populate(hub_server)
    monkeypatch.setenv("LLAMATUI_HOME", str(tmp_path))
    return hub_server


# ----------------------------------------------------------------------------- no server


@pytest.mark.parametrize("text,ref", [
    ("bartowski/Llama-3.2-1B-Instruct-GGUF", ModelRef("bartowski/Llama-3.2-1B-Instruct-GGUF")),
    ("unsloth/gemma-3-270m-it-GGUF:Q8_0", ModelRef("unsloth/gemma-3-270m-it-GGUF", "Q8_0")),
    ("unsloth/Qwen3-8B-GGUF:UD-Q4_K_XL", ModelRef("unsloth/Qwen3-8B-GGUF", "UD-Q4_K_XL")),
    ("a/b/sub/file-Q4_0.gguf", ModelRef("a/b", filename="sub/file-Q4_0.gguf")),
    ("https://huggingface.co/a/b", ModelRef("a/b")),
    ("https://huggingface.co/a/b/tree/main", ModelRef("a/b", revision="main")),
    ("https://huggingface.co/a/b/blob/main/x-Q8_0.gguf",
     ModelRef("a/b", filename="x-Q8_0.gguf", revision="main")),
    ("https://huggingface.co/a/b/resolve/abc123/d/x.gguf?download=true",
     ModelRef("a/b", filename="d/x.gguf", revision="abc123")),
    ("hf.co/a/b:Q4_K_M", ModelRef("a/b", "Q4_K_M")),
])
def test_parse_ref(text, ref):
    assert parse_ref(text) == ref


@pytest.mark.parametrize("bad", ["", "justaname", "https://example.com/a/b", "a/b c"])
def test_parse_ref_rejects(bad):
    with pytest.raises(ValueError):
        parse_ref(bad)


@pytest.mark.parametrize("name,quant", [
    ("Llama-3.2-1B-Instruct-Q4_K_M.gguf", "Q4_K_M"),
    ("gemma-3-270m-q4_k_m.gguf", "Q4_K_M"),
    ("llama-2-7b.Q5_K_S.gguf", "Q5_K_S"),
    ("Qwen3-8B-UD-Q4_K_XL.gguf", "Q4_K_XL"),
    ("model-IQ2_XXS.gguf", "IQ2_XXS"),
    ("Phi-3-mini-4k-instruct-fp16.gguf", "F16"),
    ("x-BF16.gguf", "BF16"),
    ("Q6_K/Big-Q6_K-00001-of-00003.gguf", "Q6_K"),
    ("BF16/model-00001-of-00002.gguf", "BF16"),
    ("Llama-3-8B.gguf", None),
])
def test_quant_of(name, quant):
    assert quant_of(name) == quant


def test_grouping_shards_mmproj_imatrix():
    files = [RemoteFile(p, s) for p, s in [
        ("M-Q4_K_M.gguf", 40), ("M-Q8_0.gguf", 80), ("Q6_K/M-Q6_K-00002-of-00002.gguf", 30),
        ("Q6_K/M-Q6_K-00001-of-00002.gguf", 31), ("mmproj-M-f16.gguf", 5),
        ("M.imatrix.dat", 1), ("imatrix.gguf", 1), ("README.md", 1)]]
    groups, mmproj, imatrix, other = group_files(files)
    assert [g.quant for g in groups] == ["Q4_K_M", "Q6_K", "Q8_0"]  # smallest first
    q6 = groups[1]
    assert q6.split and q6.complete and q6.size == 61
    assert [f.shard for f in q6.files] == [(1, 2), (2, 2)]
    assert [f.path for f in mmproj] == ["mmproj-M-f16.gguf"]
    assert sorted(f.path for f in imatrix) == ["M.imatrix.dat", "imatrix.gguf"]
    assert [f.path for f in other] == ["README.md"]
    assert shard_of("a-00003-of-00010.gguf") == (3, 10)


def test_shards_group_by_prefix_and_count():
    files = [RemoteFile(p, 10) for p in [
        "Q8_0/M-Q8_0-00001-of-00002.gguf", "Q8_0/M-Q8_0-00002-of-00002.gguf", "M-Q8_0.gguf",
        "big/M-Q4_K_M-00001-of-00003.gguf", "big/M-Q4_K_M-00003-of-00003.gguf",
        "M-00001-of-00002.gguf", "M-00002-of-00002.gguf"]]
    groups = {g.quant: g for g in group_files(files)[0]}
    # a single file beside a split one of the same quantization: two models
    assert [f.path for f in groups["Q8_0 (M-Q8_0-00001-of-00002.gguf)"].files] == [
        "Q8_0/M-Q8_0-00001-of-00002.gguf", "Q8_0/M-Q8_0-00002-of-00002.gguf"]
    assert [f.path for f in groups["Q8_0"].files] == ["M-Q8_0.gguf"]
    assert groups["Q8_0"].complete and not groups["Q8_0"].split
    q4 = groups["Q4_K_M"]  # shard 2 of 3 not listed
    assert q4.split and not q4.complete and q4.size == 20
    # no quantization in the name: the prefix names the group
    assert groups["M"].split and groups["M"].complete and groups["M"].size == 20


def test_quality_order_and_engine_support():
    assert hub.quality_rank("Q8_0") < hub.quality_rank("Q6_K") < hub.quality_rank("Q4_K_M") \
        < hub.quality_rank("Q2_K")
    assert hub.quality_rank("Q6_K_L") < hub.quality_rank("Q6_K")
    assert hub.engine_supports("Q4_K_M") and hub.engine_supports("UD-Q4_K_XL".split("-")[1])
    assert hub.engine_supports("NVFP4") is False and hub.engine_supports(None) is None
    # the low-bit files people pick for big models on small machines run
    assert all(hub.engine_supports(q) for q in ("IQ2_XS", "IQ1_M", "IQ3_XXS", "TQ1_0", "MXFP4_MOE"))


# ----------------------------------------------------------------------------- search


def test_search_filters_gguf_and_sorts(hubsrv):
    by_downloads = [m.id for m in hub.search_models()]
    assert by_downloads[:3] == ["other/Popular-GGUF", "acme/Tiny-GGUF", "acme/NoDefault-GGUF"]
    assert "acme/Torch-Model" not in by_downloads  # not tagged gguf
    assert "acme/Private-GGUF" not in by_downloads
    assert [m.id for m in hub.search_models(sort="likes")][0] == "acme/NoDefault-GGUF"
    found = hub.search_models("tiny")
    assert [m.id for m in found] == ["acme/Tiny-GGUF"]
    assert found[0].downloads == 500 and found[0].likes == 40
    q = [r for r in hubsrv.requests if r["path"] == "/api/models"][-1]["query"]
    assert q["filter"] == ["gguf"] and q["search"] == ["tiny"] and q["sort"] == ["downloads"]
    assert len(hub.search_models(limit=2)) == 2
    assert not [r for r in hubsrv.requests if "agent-harnesses" in r["path"]]
    with pytest.raises(ValueError):
        hub.search_models(sort="stars")


def test_search_results_say_whether_the_engine_runs_them(hubsrv):
    found = {m.id: m for m in hub.search_models()}
    assert found["acme/Tiny-GGUF"].architecture == "llama"
    assert found["acme/Tiny-GGUF"].engine_runs is True  # llama is in the catalog
    assert found["other/Popular-GGUF"].engine_runs is False  # mamba is not
    assert found["acme/NoDefault-GGUF"].engine_runs is None  # the Hub gave no summary
    q = [r for r in hubsrv.requests if r["path"] == "/api/models"][-1]["query"]
    assert "gguf" in q["expand"]  # asked for, so the Hub includes the summary


def test_search_command(hubsrv, capsys):
    assert main(["search", "gguf", "--sort", "likes"]) == 0
    out = capsys.readouterr().out
    assert out.index("acme/NoDefault-GGUF") < out.index("acme/Tiny-GGUF")
    assert "acme/Gated-GGUF" in out and "gated" in out
    assert "no (mamba)" in out and "runs" in out
    assert main(["search", "tiny", "--json"]) == 0
    assert [m["id"] for m in json.loads(capsys.readouterr().out)] == ["acme/Tiny-GGUF"]


# ----------------------------------------------------------------------------- listings


def test_listing_groups_sizes_and_gguf_info(hubsrv):
    repo = hubsrv.repos["acme/Tiny-GGUF"]
    listing = hub.list_files("acme/Tiny-GGUF")
    assert listing.revision == repo.sha and not listing.offline
    assert {g.quant for g in listing.groups} == {"IQ2_XS", "Q2_K", "Q4_K_M", "Q6_K", "Q8_0"}
    q4 = listing.group("q4_k_m")
    f = repo.files["Tiny-Q4_K_M.gguf"]
    assert q4.first.size == f.size and q4.first.sha256 == f.sha256 and not q4.split
    q6 = listing.group("Q6_K")
    assert q6.split and [x.path for x in q6.files] == [
        "Q6_K/Tiny-Q6_K-00001-of-00002.gguf", "Q6_K/Tiny-Q6_K-00002-of-00002.gguf"]
    assert q6.size == sum(repo.files[x.path].size for x in q6.files)
    assert [x.path for x in listing.mmproj] == ["mmproj-Tiny-F16.gguf"]
    assert [x.path for x in listing.imatrix] == ["Tiny.imatrix.dat"]
    assert listing.gguf.parameters == 1_443_072 and listing.gguf.architecture == "llama"
    assert listing.gguf.context_length == 4096 and listing.gguf.chat_template
    assert listing.group("IQ2_XS").supported and q4.supported
    # sizes increase down the list
    sizes = [g.size for g in listing.groups]
    assert sizes == sorted(sizes)
    # the API call asked for files metadata
    api = [r for r in hubsrv.requests if r["path"] == "/api/models/acme/Tiny-GGUF"][-1]
    assert api["query"].get("blobs") == ["True"] or api["query"].get("blobs") == ["true"]


def test_quant_selection_like_llama_cpp(hubsrv):
    tiny = hub.list_files("acme/Tiny-GGUF")
    assert tiny.select().quant == "Q4_K_M"  # the default when present
    assert tiny.select("q8_0").quant == "Q8_0"
    assert tiny.select("Q6_K").split
    nodef = hub.list_files("hf.co/acme/NoDefault-GGUF")
    assert nodef.select().quant == nodef.groups[0].quant == "Q5_K_M"  # else the first
    with pytest.raises(EntryNotFoundError, match="no Q3_K_M file; quantizations: .*Q8_0"):
        tiny.select("Q3_K_M")


def test_other_hf_api_endpoints_of_the_stand_in(hubsrv):
    """list_repo_tree and get_paths_info (used for single files) work against it too."""
    api = hub.hf_api()
    tree = {f.path: f for f in api.list_repo_tree("acme/Tiny-GGUF", recursive=True)}
    f = hubsrv.repos["acme/Tiny-GGUF"].files["Tiny-Q8_0.gguf"]
    assert tree["Tiny-Q8_0.gguf"].lfs.sha256 == f.sha256
    top = {f.path for f in api.list_repo_tree("acme/Tiny-GGUF")}
    assert "Q6_K" in top and "Q6_K/Tiny-Q6_K-00001-of-00002.gguf" not in top
    info = hub.paths_info("acme/Tiny-GGUF", ["Tiny-Q8_0.gguf", "README.md"])
    assert info["Tiny-Q8_0.gguf"].sha256 == f.sha256 and info["README.md"].sha256 is None
    meta = hub.file_metadata("acme/Tiny-GGUF", "Tiny-Q8_0.gguf")
    assert meta.etag == f.sha256 and meta.size == f.size
    assert meta.commit_hash == hubsrv.repos["acme/Tiny-GGUF"].sha


def test_fetch_header_by_ranges(hubsrv):
    g = hub.fetch_header("acme/Tiny-GGUF", "Tiny-Q4_K_M.gguf", first_bytes=4096)
    assert g.metadata["general.architecture"] == "llama"
    assert g.tensors["token_embd.weight"].shape == (8192, 256)
    ranges = [r["headers"].get("range") for r in hubsrv.file_requests("/cdn/")]
    assert ranges[0] == "bytes=0-4095" and len(ranges) > 2  # grew until the header fit
    size = hubsrv.repos["acme/Tiny-GGUF"].files["Tiny-Q4_K_M.gguf"].size
    assert sum(int(r.split("-")[1]) - int(r.split("=")[1].split("-")[0]) + 1
               for r in ranges) < size / 2  # never the whole file


# ----------------------------------------------------------------------------- errors


def test_missing_repo_and_file(hubsrv):
    with pytest.raises(RepoNotFoundError, match="acme/Nope-GGUF not found"):
        hub.list_files("acme/Nope-GGUF")
    with pytest.raises(RepoNotFoundError, match="private"):
        hub.list_files("acme/Private-GGUF")
    with pytest.raises(EntryNotFoundError, match="no such file"):
        hub.file_metadata("acme/Tiny-GGUF", "nope.gguf")
    hubsrv.not_found_code = "RepositoryNotFound"  # a spelling huggingface_hub does not map
    with pytest.raises(RepoNotFoundError, match="acme/Nope-GGUF not found"):
        hub.list_files("acme/Nope-GGUF")
    with pytest.raises(RepoNotFoundError):
        hub.file_metadata("acme/Nope-GGUF", "x.gguf")


def test_gated_repo(hubsrv, monkeypatch):
    listing = hub.list_files("acme/Gated-GGUF")  # metadata of a gated repo is public
    assert listing.gated == "manual"
    with pytest.raises(GatedRepoError, match="gated repository: accept its license"):
        hub.file_metadata("acme/Gated-GGUF", "Gated-Q4_K_M.gguf")
    hub_requests = hubsrv.file_requests("/acme/Gated-GGUF/resolve/")
    assert hub_requests and all(r["headers"].get("authorization") for r in hub_requests)
    monkeypatch.delenv("HF_TOKEN")  # without a token: 401 instead of 403, same error
    monkeypatch.setenv("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1")
    with pytest.raises(GatedRepoError):
        hub.fetch_header("acme/Gated-GGUF", "Gated-Q4_K_M.gguf")


def test_unreachable_hub_and_offline_listing(hubsrv, tmp_path, monkeypatch):
    from llamatui.models.download import pull
    pull("acme/Tiny-GGUF:Q8_0")
    hubsrv.stop()
    listing = hub.list_files("acme/Tiny-GGUF")
    assert listing.offline and [g.quant for g in listing.groups] == ["Q8_0"]
    assert listing.revision == hubsrv.repos["acme/Tiny-GGUF"].sha
    assert listing.groups[0].first.sha256 == hubsrv.repos["acme/Tiny-GGUF"].files[
        "Tiny-Q8_0.gguf"].sha256
    with pytest.raises(HubUnreachableError, match="cannot reach the Hub"):
        hub.list_files("acme/NoDefault-GGUF")
    with pytest.raises(HubUnreachableError):
        hub.search_models("tiny")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub.list_files("acme/Tiny-GGUF").offline


def test_endpoint_is_read_at_call_time(monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9/")
    assert hub.hub_endpoint() == "http://127.0.0.1:9"
    assert hub.resolve_url("a/b", "x.gguf").startswith("http://127.0.0.1:9/a/b/resolve/main/")
    monkeypatch.delenv("HF_ENDPOINT")
    import huggingface_hub.constants as c
    monkeypatch.setattr(c, "ENDPOINT", "http://127.0.0.1:8")
    assert hub.hub_endpoint() == "http://127.0.0.1:8"
