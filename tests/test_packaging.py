"""The package as pip installs it: gin files, the vocabulary and the kernels' sources travel,
and are found."""
import os
import subprocess
import sys
import zipfile

from t2t import config
from t2t.models import small_dots

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_wheel_carries_gin_files_and_the_vocabulary(tmp_path):
  out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                        "-q", "-w", str(tmp_path), ROOT], capture_output=True, text=True,
                       timeout=300)
  assert out.returncode == 0, out.stderr[-2000:]
  (wheel,) = [p for p in os.listdir(tmp_path) if p.endswith(".whl")]
  names = zipfile.ZipFile(tmp_path / wheel).namelist()
  data = "t2t-0.1.0.data/data/share/t2t/gin/"
  for gin_file in ("runs/pretrain.gin", "runs/finetune.gin", "runs/eval.gin", "runs/infer.gin",
                   "models/t5_1_0/tiny.gin", "experiments/bbc_demo/pretrain.gin"):
    assert data + gin_file in names, gin_file
  assert "tasks/vocab/bbc_sp8k.model" in names
  assert "t2t/train.py" in names and not any(n.startswith("tools/") for n in names)
  for library in small_dots.LIBRARIES:   # the kernels are compiled from these on first use
    for path in (library.source, *library.headers):
      assert f"t2t/models/{path.name}" in names, path.name


def test_installed_gin_directory_is_searched(tmp_path, monkeypatch):
  installed = tmp_path / "share" / "t2t" / "gin" / "runs"
  installed.mkdir(parents=True)
  (installed / "only_installed.gin").write_text("X = 1\n")
  monkeypatch.setattr(config.sysconfig, "get_path", lambda name: str(tmp_path))
  monkeypatch.chdir(tmp_path)
  assert str(tmp_path / "share" / "t2t" / "gin") in config.gin_search_paths()
  assert config.resolve_gin_file("runs/only_installed.gin") == installed / "only_installed.gin"
