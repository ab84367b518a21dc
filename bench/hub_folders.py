#!/usr/bin/env python3
"""evalharness's reading of downloaded dataset folders against Hugging Face `datasets` (the Hub's own loader), on
folders laid out as the Hub ships them. Run by hand, never by CI (a throwaway virtualenv, offline):

    python3 -m venv /tmp/pq && /tmp/pq/bin/pip install datasets
    HF_DATASETS_OFFLINE=1 /tmp/pq/bin/python bench/hub_folders.py

For each folder: the configs `datasets.get_dataset_config_names` finds against evalharness.hub_layout's, then for
every config the splits `load_dataset(folder, config)` gives, and every row of every split against the rows
evalharness reads from the same config and split (DataPath). Prints one line a folder and each difference; exits
1 on any difference. The folders: a card listing configs with per-split globs (gsm8k's layout), a card with a list
of patterns and `**`, a card marking `default: true`, MMLU's shape
(CONFIG/SPLIT-00000-of-00001.parquet with `all`), the conventional `data/SPLIT-*.parquet` (a split over two
shards), JSONL files named by split words (train, dev, test) and a folder per split. (Not compared: a split mixing
Parquet and JSONL files, and data_files given as a mapping of split to paths, which `datasets` refuses and
evalharness reads.)
"""

import json
import os
import shutil
import sys
import tempfile

os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import evalharness as eh  # noqa: E402

import datasets  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402


def rows(n, tag):
    return [{"question": "%s question %d" % (tag, i), "answer": "%d" % (i * 7), "n": i} for i in range(n)]


def write(root, files, readme=None):
    for rel, data in files.items():
        path = os.path.join(root, *rel.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if rel.endswith(".parquet"):
            pq.write_table(pa.Table.from_pylist(data), path)
        else:
            with open(path, "w") as fh:
                fh.writelines(json.dumps(r) + "\n" for r in data)
    if readme:
        with open(os.path.join(root, "README.md"), "w") as fh:
            fh.write(readme)


FOLDERS = {
    "gsm8k-card": ({"main/train-00000-of-00001.parquet": rows(5, "mt"), "main/test-00000-of-00001.parquet": rows(3, "ms"),
                    "socratic/test-00000-of-00001.parquet": rows(2, "st")},
                   "---\nconfigs:\n- config_name: main\n  data_files:\n  - split: train\n    path: main/train-*\n"
                   "  - split: test\n    path: main/test-*\n- config_name: socratic\n  data_files:\n  - split: test\n"
                   "    path: socratic/test-*\n---\n"),
    "card-globs": ({"data/a/test-00000-of-00001.parquet": rows(2, "a"), "data/b/c/test-1.parquet": rows(1, "b"),
                    "extra/more_test.parquet": rows(1, "c"), "data/a/train-0.parquet": rows(4, "d")},
                   "---\nconfigs:\n  - config_name: default\n    data_files:\n      - split: test\n        path:\n"
                   "          - \"data/**/test-*.parquet\"\n          - extra/more_test.parquet\n      - split: train\n"
                   "        path: data/a/train-*\n---\n"),
    "card-default": ({"small/a.jsonl": rows(1, "s"), "large/b.jsonl": rows(2, "l")},
                     "---\nconfigs:\n- config_name: small\n  data_files: small/*.jsonl\n- config_name: large\n"
                     "  default: true\n  data_files:\n  - split: test\n    path: large/*.jsonl\n---\n"),
    "mmlu-shape": ({"all/test-00000-of-00001.parquet": rows(4, "at"), "all/dev-00000-of-00001.parquet": rows(2, "ad"),
                    "algebra/test-00000-of-00001.parquet": rows(2, "gt"),
                    "algebra/dev-00000-of-00001.parquet": rows(1, "gd")},
                   "---\nconfigs:\n- config_name: all\n  data_files:\n  - split: test\n    path: all/test-*\n"
                   "  - split: dev\n    path: all/dev-*\n- config_name: algebra\n  data_files:\n  - split: test\n"
                   "    path: algebra/test-*\n  - split: dev\n    path: algebra/dev-*\n---\n"),
    "data-shards": ({"data/test-00000-of-00002.parquet": rows(3, "t0"), "data/test-00001-of-00002.parquet": rows(2, "t1"),
                     "data/train-00000-of-00001.parquet": rows(4, "tr")}, None),
    "split-words": ({"train.jsonl": rows(3, "tr"), "dev.jsonl": rows(2, "dv"), "test.jsonl": rows(1, "te")}, None),
    "split-folders": ({"train/0000.parquet": rows(2, "tr"), "test/0000.parquet": rows(3, "te"),
                       "validation/0000.parquet": rows(1, "va")}, None),
}


def main():
    work = tempfile.mkdtemp(prefix="hub-folders-")
    failed = []
    compared = 0
    try:
        for name, (files, readme) in FOLDERS.items():
            root = os.path.join(work, name)
            write(root, files, readme)
            diffs = []
            ours, _source = eh.hub_layout(root)
            ours = {c: s for c, s in ours.items() if any(s.values())}
            theirs = datasets.get_dataset_config_names(root)
            if sorted(ours) != sorted(theirs):
                diffs.append("configs: evalharness %s, datasets %s" % (sorted(ours), sorted(theirs)))
            for config in sorted(set(ours) & set(theirs)):
                loaded = datasets.load_dataset(root, config)
                if sorted(ours[config]) != sorted(loaded):
                    diffs.append("%s splits: evalharness %s, datasets %s" % (config, sorted(ours[config]),
                                                                             sorted(loaded)))
                for split in sorted(set(ours[config]) & set(loaded)):
                    mine = [row for _w, row in eh._iter_raw_rows(eh.DataPath(root, config, split))]
                    ref = loaded[split].to_list()
                    compared += len(ref)
                    if mine != ref:
                        diffs.append("%s/%s: %d rows read, datasets %d%s" % (
                            config, split, len(mine), len(ref), "" if len(mine) != len(ref) else " (values differ)"))
            print("%-14s %s" % (name, "same configs, splits and rows" if not diffs else "; ".join(diffs)))
            if diffs:
                failed.append(name)
        print("%d folders, %d rows compared with datasets %s: %s" % (
            len(FOLDERS), compared, datasets.__version__, "no difference" if not failed else "differences in %s"
            % ", ".join(failed)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
