"""What one training step of a default run executes, line by line: `python tests/one_step_trace.py MODEL_DIR`.

Runs `train.main` on configs/default.gin (in a process of its own: it switches tf.functions to eager and installs a
tracer) and records, during the first call of the compiled train loop, every line of this repository's files that
runs. Eager execution runs the Python of the step, line by line, as the compiled loop traces it. Prints one JSON
object: `step`, the files in the order the step first enters them, each with the line ranges of the functions it ran
(a function's `def` to its last line, neighbouring functions joined); `modules`, every module loaded by the end of
the run. tests/test_one_step.py checks docs/one_step.md against it.
"""

import ast
import json
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def function_spans(path: str) -> list[tuple[int, int]]:
    """(first line, last line) of every function in `path`, decorators included, lambdas not."""
    tree = ast.parse(open(path).read())
    return [(min([node.lineno] + [decorator.lineno for decorator in node.decorator_list]), node.end_lineno)
            for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def step_ranges(executed: dict[str, set[int]]) -> dict[str, list[tuple[int, int]]]:
    """Per file, the spans of the innermost functions holding the executed lines, joined where only blank or comment
    lines lie between two spans."""
    ranges = {}
    for path, lines in executed.items():
        spans = function_spans(os.path.join(REPO_ROOT, path))
        chosen = set()
        for line in lines:
            holding = [span for span in spans if span[0] <= line <= span[1]]
            if holding:
                chosen.add(min(holding, key=lambda span: span[1] - span[0]))
        text = open(os.path.join(REPO_ROOT, path)).read().splitlines()
        joined = []
        for start, end in sorted(chosen):
            between = text[joined[-1][1]:start - 1] if joined else None  # Empty when the spans touch or nest.
            if joined and all(not line.strip() or line.strip().startswith("#") for line in between):
                joined[-1] = (joined[-1][0], max(joined[-1][1], end))
            else:
                joined.append((start, end))
        ranges[path] = joined
    return ranges


def trace_default_run(model_dir: str) -> dict:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    import train
    from tpu_utils import loop

    order, executed = [], {}
    make_train_loop = loop.make_train_loop

    def tracer(frame, event, argument):
        """Traces the lines of this repository's frames only (None: not those of TensorFlow, Keras, ...)."""
        path = os.path.relpath(frame.f_code.co_filename, REPO_ROOT)
        if path.startswith(("..", ".venv", "tests" + os.sep)) or not path.endswith(".py"):
            return None
        if event == "line":
            if path not in executed:
                order.append(path)
            executed.setdefault(path, set()).add(frame.f_lineno)
        return tracer

    def traced_make_train_loop(*args, **kwargs):
        train_loop = make_train_loop(*args, **kwargs)
        calls = []

        def first_call_traced(source, num_steps):
            if calls:
                return train_loop(source, num_steps)
            calls.append(1)
            tf.config.run_functions_eagerly(True)
            sys.settrace(tracer)
            try:
                return train_loop(source, num_steps)
            finally:
                sys.settrace(None)
                tf.config.run_functions_eagerly(False)

        return first_call_traced

    loop.make_train_loop = traced_make_train_loop
    # One loop of 2 steps, the traced one (the step's lines and the modules loaded are those of a longer run: 10 steps
    # gave the same record, 5 s later; a second, compiled loop would only add its compile time), then the run's end:
    # evaluation and export.
    code = train.main(["train.py", f"--model_dir={model_dir}", "--gin_param=TRAIN_STEPS=2",
                       "--gin_param=cosine.warmup_steps=1", "--gin_param=STEPS_PER_LOOP=2", "--gin_param=EVAL_EVERY=0",
                       "--gin_param=CHECKPOINT_EVERY=0"])
    if code != 0:
        raise SystemExit(f"the default run exited {code}")
    ranges = step_ranges(executed)
    return {"step": [[path, ranges[path]] for path in order], "modules": sorted(sys.modules)}


if __name__ == "__main__":
    sys.path.insert(0, REPO_ROOT)
    os.chdir(REPO_ROOT)
    result = trace_default_run(sys.argv[1])
    print("TRACE " + json.dumps(result))
