"""The command line: no option is ever taken from a prefix of its name, on any command and on every supported
Python (3.8 included, where subcommands' parsers are made apart from the main one), and an option a command does not
have is refused naming the closest one it has."""
import contextlib
import io
import json
import subprocess
import unittest

from tests.support import ROOT, eh
from tests.test_packaging import find_python

# the least each command needs to parse (its required options and positionals)
BASE_ARGS = {("run",): ["--dataset", "d.jsonl"], ("suite",): ["nightly.toml"], ("report",): ["RUN"],
             ("merge",): ["OUT"], ("dataset",): ["PATH"],
             ("slurm", "submit"): ["--shards", "2"], ("slurm", "status"): ["OUT"]}


def _parsers(parser, path=()):
    """(command path, parser) of the main parser and every command's (images plan and slurm submit included)."""
    yield path, parser
    for action in parser._actions:
        if action.choices and hasattr(action, "_name_parser_map"):
            for name, sub in action.choices.items():
                yield from _parsers(sub, path + (name,))


def _value(action):
    """A value the option accepts."""
    if action.choices:
        return str(list(action.choices)[0])
    return {"extra_body": "{}", "fields": "a=b", "prompt_template": "Q: {question}"}.get(action.dest, "1")


def _parse(argv, parser=None):
    """(exit code or None, stderr) of parsing argv with the real command line (``parser``: one built already)."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            (parser or eh._build_parser()).parse_args(argv)
    except SystemExit as exc:
        return exc.code, err.getvalue()
    return None, err.getvalue()


def abbreviation_failures():
    """Every (argv, what happened) where an option's prefix was not refused as unrecognized; [] when the rule holds.
    Also run by the test under Python 3.8 in a subprocess."""
    failures = []
    top = eh._build_parser()
    for path, parser in _parsers(top):
        if parser.allow_abbrev:  # argparse's own rule, off on each parser: a subcommand's is made apart
            failures.append((list(path), "allow_abbrev is on"))
        if parser._subparsers is not None:
            continue  # its options are checked below with a command after them (--verbos demo)
        base = list(path) + BASE_ARGS.get(path, [])
        code, err = _parse(base, top)
        if code is not None:
            failures.append((base, "the base arguments do not parse: %s" % err.strip()))
            continue
        options = set(parser._option_string_actions)
        for option, action in parser._option_string_actions.items():
            if not option.startswith("--") or option == "--help":
                continue
            value = [_value(action)] if action.nargs not in (0, "?") else []
            code, err = _parse(base + [option] + value, top)
            if code is not None:
                failures.append((base + [option] + value, "the option itself does not parse: %s" % err.strip()))
            for cut in (1, 3):
                prefix = option[:-cut]
                if len(prefix) < 4 or prefix in options:
                    continue
                code, err = _parse(base + [prefix] + value, top)
                if code != 2 or "unrecognized argument: %s" % prefix not in err:
                    failures.append((base + [prefix] + value, "exit %r: %s" % (code, err.strip())))
    return failures


class TestOptions(unittest.TestCase):

    def test_an_unknown_option_is_refused_naming_the_closest_valid_one(self):
        cases = [(["run", "--dataset", "qa.jsonl", "--modle", "Qwen/Qwen3-8B"], "--modle (did you mean --model?)"),
                 (["run", "--dataset", "qa.jsonl", "--model", "m", "--concurency", "4"],
                  "--concurency (did you mean --concurrency?)"),
                 (["run", "--datset", "qa.jsonl", "--model", "m"], "--datset (did you mean --dataset?)"),
                 (["run", "--dataset", "qa.jsonl", "--model", "m", "--max-token=64"],
                  "--max-token=64 (did you mean --max-tokens?)"),
                 (["images", "plan", "--image-tar", "/data"], "--image-tar (did you mean --image-tars?)"),
                 (["serve-mock", "--prot", "8000"], "--prot (did you mean --port?)"),
                 (["--verbos", "demo"], "--verbos (did you mean --verbose?)"),
                 (["slurm", "submit", "--shards", "2", "--", "--dataset", "d", "--out", "o", "--temprature", "1"],
                  "--temprature (did you mean --temperature?)"),
                 (["slurm", "submit", "--shards", "2", "--dataset", "d"], "--dataset (RUN OPTIONS go after --)")]
        for argv, want in cases:
            err = io.StringIO()
            with self.assertRaises(SystemExit) as caught, contextlib.redirect_stderr(err):
                eh.main(argv)
            self.assertEqual(caught.exception.code, 2, argv)
            self.assertIn(want, err.getvalue(), argv)
            self.assertNotIn("required", err.getvalue(), argv)  # a misspelt required option is not "missing"
            self.assertEqual(len(err.getvalue().strip().splitlines()), 1, err.getvalue())

    def test_a_value_that_looks_like_an_option_after_the_run_options_separator_is_left_alone(self):
        args = eh._build_parser().parse_args(["slurm", "submit", "--shards", "2", "run", "--dataset", "d", "--out",
                                              "o"])
        self.assertEqual(args.run_args, ["run", "--dataset", "d", "--out", "o"])
        args = eh._build_parser().parse_args(["run", "--dataset", "d", "--system-prompt", "--be brief"])
        self.assertEqual(args.system_prompt, "--be brief")  # (argparse reads a dash word with a space as a value)

    def test_no_option_is_taken_from_a_prefix_of_its_name_on_any_command(self):
        self.assertEqual(abbreviation_failures(), [])
        # the case the issue met: --max-token 64 is not --max-tokens 64
        code, err = _parse(["run", "--dataset", "d.jsonl", "--max-token", "64"])
        self.assertEqual(code, 2)
        self.assertIn("did you mean --max-tokens?", err)

    def test_no_option_is_taken_from_a_prefix_of_its_name_on_python_38(self):
        python = find_python("3.8")
        if python is None:
            self.skipTest("no Python 3.8 here (pyenv)")
        res = subprocess.run([python, "-c", "import json, sys; sys.path.insert(0, %r); from tests import test_cli; "
                                            "print(json.dumps(test_cli.abbreviation_failures()))" % ROOT],
                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True,
                             timeout=120)
        self.assertEqual(res.returncode, 0, res.stderr)
        self.assertEqual(json.loads(res.stdout.strip().splitlines()[-1]), [])


if __name__ == "__main__":
    unittest.main()
