import subprocess
import sys


def test_eval_data_side_imports_no_torch():
    code = ("import sys, rcllm.eval, rcllm.eval.datasets, rcllm.eval.protocol, rcllm.eval.metrics;"
            "from rcllm.eval.datasets import load_dataset;"
            "[load_dataset('', 'synthetic', num_users=3, num_items=10)];"
            "import rcllm.eval.datasets.amazon2018, rcllm.eval.datasets.amazon2023,"
            " rcllm.eval.datasets.yelp, rcllm.eval.datasets.goodreads, rcllm.eval.datasets.movielens;"
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
