"""The numbers of report.md's text, filled from the same inputs as the tables and figures, so a
rebuilt report never shows one run's figure beside another's number.

A placeholder is `{{SOURCE.FIELD[.FIELD...][:FORMAT]}}`, e.g. `{{gpt_run_tiny_standin_cpu.total_seconds:.1f}}`,
`{{lenet.test_accuracy:.2%}}`, `{{gpt_bench_cpu_2x1024.rungs.0.tokens_per_second:,.0f}}`:

    SOURCE   a results file by its figure name (its file name without .json; where two share a name,
             its path with '/' as '_'), or an alias: `lenet` / `gpt`, the LeNet-5 / GPT run named on
             the command line, else the committed run in ALIASES
    FIELD    a key of its JSON, or a list index (0, 1, -1)
    FORMAT   Python's format spec; without one: ints with thousands separators, floats to 4 digits

    `{{SOURCE._source}}` is the file a source was read from (a caption names the run it shows).

An unknown source or field, a null value or one that is not a single value is a problem (never a
blank); placeholders.md lists every key with its value and source (`available_lines`).

A block between `<!-- if NAME -->` and `<!-- /if -->` (or `<!-- unless NAME -->` ... `<!-- /unless -->`)
is kept only when NAME is (is not) among the inputs: a source name, `team` (no runs named: the
repository's own report) or `own` (a student's runs named). So a student's report never carries a
caption written for the team's runs, and a missing input is a sentence, not a blank (`select_blocks`).
"""
import re

from report.inputs import figure_name, rel

# alias -> (run kind, the committed run it follows when none is named): the default recipe's LeNet-5 run
# (its events beside it) and the headline GPT run, a cold compile cache
ALIASES = {"lenet": ("lenet5", "lenet_run_2x128_cpu"), "gpt": ("gpt", "gpt_run_12M-cold_standin_h200")}
PLACEHOLDER = re.compile(r"\{\{\s*([^{}:\s]+)\s*(?::([^{}]*))?\}\}")
LONGEST_LISTED = 12  # lists longer than this (curves, histories) are not listed key by key


def fact_sources(results, shown):
    """{source name: (its JSON, where it came from)}: every results file, then each alias (`lenet`, `gpt`): the
    run its section shows (derived.shown_runs, the one place a kind not named falls back to a committed run)."""
    sources = {figure_name(key, results): (data, rel(path)) for key, (data, path) in results.items()}
    for run in shown.values():
        sources[run["alias"]] = run["metrics"], run["source"]
    return sources


# a block with no block inside it: nested ones are resolved from the innermost out
BLOCK = re.compile(r"<!--\s*(if|unless)\s+([\w.-]+)\s*-->((?:(?!<!--\s*(?:if|unless)\s).)*?)"
                   r"<!--\s*/\1\s*-->\n?", re.S)
FIGURE_NUMBER = re.compile(r"图 #")


def select_blocks(text, present):
    """report.md with each `<!-- if NAME -->` block kept only where NAME is in `present` (`unless`: only
    where it is not), blocks inside blocks too; then the figures that remain numbered in order (`图 #`)."""
    while True:
        kept = BLOCK.sub(lambda m: "\n" + m.group(3).strip("\n") + "\n\n"  # a paragraph of its own
                         if (m.group(2) in present) == (m.group(1) == "if") else "", text)
        if kept == text:
            break
        text = kept
    numbers = iter(range(1, 1000))
    return re.sub(r"\n{3,}", "\n\n", FIGURE_NUMBER.sub(lambda m: f"图 {next(numbers)}", text))


def look_up(sources, key):
    """(value, source) of a placeholder's key; KeyError with the reason when it names nothing usable."""
    name, _, path = key.partition(".")
    if name not in sources:
        raise KeyError(f"no input named '{name}'")
    value, source = sources[name]
    if path == "_source":
        return source, source
    for part in path.split(".") if path else []:
        try:
            value = value[int(part)] if isinstance(value, list) else value[part]
        except (KeyError, IndexError, ValueError, TypeError):
            raise KeyError(f"{source} has no '{part}' in '{key}'") from None
    if value is None:
        raise KeyError(f"{source}: '{key}' is null (missing or invalid when measured)")
    if isinstance(value, (list, dict)):
        raise KeyError(f"{source}: '{key}' is a {type(value).__name__}, not one value")
    return value, source


def render(value, spec):
    if spec:
        return format(value, spec)
    if isinstance(value, bool) or isinstance(value, str):
        return str(value)
    return f"{value:,}" if isinstance(value, int) else f"{value:.4g}"


def fill(text, sources):
    """(text with each placeholder replaced, [problem], [(placeholder, value, source)]). A placeholder
    that cannot be filled stays as written, so a PDF is never made with a silent blank."""
    problems, used = [], []

    def one(match):
        key, spec = match.group(1), (match.group(2) or "").strip()
        try:
            value, source = look_up(sources, key)
            shown = render(value, spec)
        except KeyError as e:
            problems.append(f"report placeholder {match.group(0)}: {e.args[0]}")
            return match.group(0)
        except (ValueError, TypeError) as e:
            problems.append(f"report placeholder {match.group(0)}: format '{spec}' does not fit {value!r} ({e})")
            return match.group(0)
        used.append((match.group(0), shown, source))
        return shown
    return PLACEHOLDER.sub(one, text), problems, used


def leaves(value, prefix):
    """(dotted key, value) of every single value in a JSON, lists longer than LONGEST_LISTED left out."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from leaves(v, f"{prefix}.{k}")
    elif isinstance(value, list):
        if len(value) <= LONGEST_LISTED:
            for i, v in enumerate(value):
                yield from leaves(v, f"{prefix}.{i}")
    elif value is not None:
        yield prefix, value


def used_lines(used):
    """results.md's list of the placeholders the report uses: placeholder -> value -> source."""
    return [f"- `{p}` -> {v} -> `{s}`" for p, v, s in used] or ["- none"]


def available_lines(sources):
    """placeholders.md: every key there is, with its value and source."""
    lines = ["# Placeholders report.md may use", "", "`{{key}}` or `{{key:format}}` (see report/facts.py); the "
             "aliases `lenet` and `gpt` follow a named run.", "", "| placeholder | value | source |", "|---|---|---|"]
    for name, (data, source) in sources.items():
        for key, value in leaves(data, name):
            shown = str(value).replace("|", "\\|").replace("\n", " ")
            lines.append(f"| `{{{{{key}}}}}` | {shown[:60]} | `{source}` |")
    return lines
