"""benchmarks/greedy_fingerprint.py for either side of the house refactor: before it (5f73fc2)
the named drafters are `specjax.drafters.named.NAMED` and the stats a dict; after it they are
the method registry's and the stats a `Stats`. Run it with the checkout under test first on
PYTHONPATH (its flags are greedy_fingerprint.py's):

    PYTHONPATH=/path/to/5f73fc2 python benchmarks/house-refactor/fingerprint.py --model smollm2 --out before.json
    PYTHONPATH=$PWD python benchmarks/house-refactor/fingerprint.py --model smollm2 --compare before.json
"""

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import greedy_fingerprint  # noqa: E402


def named():
    """The named drafters before the registry: their names, and make(name, target)."""
    from specjax.drafters.named import NAMED, named_drafter
    return list(NAMED), named_drafter


if __name__ == "__main__":
    import specjax  # asked by file: the editable install would lend main's specjax.methods to 5f73fc2
    if (pathlib.Path(specjax.__file__).parent / "methods.py").is_file():
        greedy_fingerprint.main()
    else:
        greedy_fingerprint.main(drafters=named, tau=lambda stats: stats["tau"])
