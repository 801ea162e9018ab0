"""Adversaries, apart from the honest roles: dishonest workers (`worker.py`: one class per cheat,
each wrapping the honest worker's parts where it acts) and a rogue validator (`validator.py`: it
amends its own verdicts). They exist so tests and demos can show the pool catches and punishes
each one.

They wrap the honest roles from outside: `meshrl adversary worker` / `meshrl adversary
validator` (`cli.py`) run the honest `WorkerNode` / `ValidatorNode` with the adversary's parts
or verdict hook handed in. No honest role imports this package (tests/test_layering.py).
"""
