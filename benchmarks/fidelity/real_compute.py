"""Real-compute cases (placeholder until written): the built-in GPT entry, two real processes."""

CASES: tuple = ()


def run_case(case):
    raise NotImplementedError
