"""Reads MosaicML llm-foundry's MPT training benchmark tables into zeroplan's calibration rows.

  python3 scripts/calibration/read_llm_foundry.py LLM_FOUNDRY_CHECKOUT > profiles/data/calibration/llm-foundry-mpt.json

LLM_FOUNDRY_CHECKOUT is a git clone of https://github.com/mosaicml/llm-foundry; the rows are read from
scripts/train/benchmarking/README.md at its HEAD and the model sizes from scripts/train/yamls/pretrain/mpt-*.yaml.
The bf16 tables are read (H100 80GB, both of them; A100 80GB; A100 40GB); the FP8 table is not (no fp8 in zeroplan).
"""
import json
import re
import subprocess
import sys

repo = sys.argv[1]


def git(*args):
    return subprocess.run(["git", "-C", repo, *args], check=True, capture_output=True, text=True).stdout


commit = git("rev-parse", "HEAD").strip()
date = git("log", "-1", "--format=%cs").strip()
readme = git("show", "HEAD:scripts/train/benchmarking/README.md")

models = {}
for size in ["125m", "350m", "760m", "1b", "3b", "7b", "13b", "30b", "70b"]:
    y = git("show", f"HEAD:scripts/train/yamls/pretrain/mpt-{size}.yaml")
    get = lambda k: int(re.search(rf"^\s+{k}:\s*(\d+)", y, re.M).group(1))
    models[size] = {"d_model": get("d_model"), "n_heads": get("n_heads"), "n_layers": get("n_layers"),
                    "expansion_ratio": get("expansion_ratio"), "vocab_size": get("vocab_size")}

rows = []
table = None
for line in readme.splitlines():
    if line.startswith("## "):
        title = line[3:].strip()
        table = title if ("BF16" in title or "A100" in title) else None
        continue
    if table is None or not line.startswith("|") or "---" in line or "Model" in line:
        continue
    c = [x.strip() for x in line.strip().strip("|").split("|")]
    rows.append({
        "table": table, "model": c[0], "seq": int(c[1]), "gpus": int(c[2]), "device": c[3],
        "mfu": float(c[4]), "hfu": float(c[5]), "micro_batch": int(c[7]), "grad_accum": int(c[8]),
        "global_batch": int(c[9]), "tokens_per_s": int(c[11]), "tokens_per_s_per_gpu": int(c[12]),
        "precision": c[14], "mp_mode": c[15], "sharding": c[16],
        "activation_checkpointing": c[17] == "True", "activation_cpu_offload": c[18] == "True",
        "num_params": int(c[19])})

doc = {
    "schema": "zeroplan.calibration_rows/1",
    "source": "MosaicML llm-foundry, MPT Training Benchmarks, scripts/train/benchmarking/README.md",
    "url": f"https://github.com/mosaicml/llm-foundry/blob/{commit}/scripts/train/benchmarking/README.md",
    "commit": commit,
    "commit_date": date,
    "notes": ("MPT models of scripts/train/yamls/pretrain/mpt-<size>.yaml: flash attention, learned positional "
              "embeddings of max_seq_len rows, biases (MPTConfig defaults no_bias false, learned_pos_emb true), "
              "low_precision_layernorm (submit_benchmarks.py), vocab 50368, FSDP with Composer on the MosaicML "
              "platform; mp_mode DEFAULT = bf16 parameters and compute, fp32 gradient reduction; PURE = bf16 "
              "reduction too. The FP8 table is not read."),
    "models": models,
    "rows": rows,
}
json.dump(doc, sys.stdout, indent=1)
print()
