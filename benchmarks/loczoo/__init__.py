"""The model/bug zoo and harness behind ``benchmarks/localisation.py``.

spec.py       what a case is; bug and clean kinds; where a bug lives (Place) as data
torch_zoo.py  the PyTorch model families and their variants (bugs, clean pairs)
ms_zoo.py     MindSpore ports of six families (imported only in the child process)
arrays.py     numpy shared by both sides: weight edits, the loss target, effect sizes
torch_run.py  dump one torch program;  ms_child.py  dump the MindSpore programs (child)
runner.py     run cases (dump, compare, score);  score.py  scoring;  report.py  tables, JSON
"""
