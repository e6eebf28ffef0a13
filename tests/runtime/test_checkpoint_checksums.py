"""Checkpoints are checked by content: every file's CRC-32 is recorded at save and compared on
resume, merge and eval, so a damaged file of the right size is caught like a truncated one; a
file torch.distributed.checkpoint cannot read is one error without torch's weights_only advice;
checkpoints written before checksums still load, checked by size (said once)."""

import json
import os

import pytest
import torch
import torch.distributed.checkpoint as dcp

from reasonrl_fast.runtime import merge
from reasonrl_fast.runtime import checkpoint as ckpt
from tests.helpers.ckpt import fake_checkpoint


def flip_byte(path, offset=-5):
    """Damage that keeps the size: one byte inverted (default: near the end)."""
    with open(path, "r+b") as f:
        f.seek(offset, os.SEEK_END if offset < 0 else os.SEEK_SET)
        b = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([b[0] ^ 0xFF]))


def test_save_records_a_checksum_per_file(tmp_path):
    path = fake_checkpoint(tmp_path, 2, "r1")
    state = ckpt.read_state(path)
    assert sorted(state["checksums"]) == sorted(state["files"])
    assert all(len(c) == 8 for c in state["checksums"].values())
    assert all(ckpt.entry_ok(rel) for rel in state["files"])  # the names the load accepts
    assert ckpt.defects(path) == []


def test_damaged_file_of_the_right_size_falls_back_on_resume(tmp_path):
    fake_checkpoint(tmp_path, 2, "r1")
    c4 = fake_checkpoint(tmp_path, 4, "r1")
    flip_byte(os.path.join(c4, "__1_0.distcp"))
    bad = ckpt.defects(c4)
    assert len(bad) == 1 and bad[0].startswith("__1_0.distcp (damaged: CRC-32 "), bad
    warnings = []
    assert ckpt.resolve_resume(str(tmp_path), "auto", warn=warnings.append) == str(tmp_path / "checkpoint-2")
    assert len(warnings) == 1 and "checkpoint-4" in warnings[0] and "__1_0.distcp (damaged" in warnings[0]
    with pytest.raises(ckpt.CheckpointError, match=r"__1_0\.distcp \(damaged"):
        ckpt.resolve_resume(str(tmp_path), c4)
    # the hf/ metadata and the RNG files are covered too
    flip_byte(os.path.join(tmp_path, "checkpoint-2", "hf", "config.json"), 0)
    assert ckpt.defects(str(tmp_path / "checkpoint-2"))[0].startswith("hf/config.json (damaged")
    assert ckpt.resolve_resume(str(tmp_path), "auto", warn=warnings.append) is None


def test_merge_names_the_damaged_file(tmp_path):
    path = fake_checkpoint(tmp_path, 2, "r1")
    flip_byte(os.path.join(path, ".metadata"))
    with pytest.raises(ckpt.CheckpointError, match=r"checkpoint-2 is not a complete, undamaged checkpoint; "
                                                   r"missing or damaged: \.metadata \(damaged"):
        merge.merge(path, str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()


def _without_checksums(path):
    state = ckpt.read_state(path)
    del state["checksums"]
    with open(os.path.join(path, ckpt.STATE), "w") as f:
        json.dump(state, f)


def test_checkpoint_without_checksums_loads_by_size_and_says_so_once(tmp_path):
    path = fake_checkpoint(tmp_path, 2, "r1")
    _without_checksums(path)
    notes = []
    assert ckpt.resolve_resume(str(tmp_path), "auto", warn=notes.append) == path
    assert ckpt.resolve_resume(str(tmp_path), "auto", warn=notes.append) == path
    assert len(notes) == 1 and "no checksums" in notes[0] and "by size only" in notes[0]
    flip_byte(os.path.join(path, "__0_0.distcp"))  # what size alone cannot see
    assert ckpt.defects(path) == []
    os.truncate(os.path.join(path, "__0_0.distcp"), 3)  # what it can
    assert ckpt.defects(path) == ["__0_0.distcp (size 3, written 64)"]


def real_dcp_checkpoint(path):
    """A one-process torch.distributed.checkpoint of a small model, laid out as the trainer's."""
    model = torch.nn.Linear(32, 32)
    dcp.save({"model": {f"lm.{k}": v for k, v in model.state_dict().items()}}, checkpoint_id=str(path), no_dist=True)
    return model


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
@pytest.mark.parametrize("damaged", ["__0_0.distcp", ".metadata"])
def test_unreadable_old_checkpoint_is_one_error_without_weights_only_advice(tmp_path, damaged):
    model = real_dcp_checkpoint(tmp_path)
    assert torch.equal(merge.load_model_tensors(str(tmp_path))["lm.weight"], model.weight)
    f = tmp_path / damaged
    data = bytearray(f.read_bytes())
    for i in range(0, len(data), 7):  # the pickled parts too, as a damaged disk block would
        data[i] ^= 0x55
    f.write_bytes(bytes(data))
    with pytest.raises(ckpt.CheckpointError, match="damaged, torch.distributed.checkpoint cannot read it") as e:
        merge.load_model_tensors(str(tmp_path))
    assert "weights_only" not in str(e.value) and "\n" not in str(e.value)
