"""`supervise completion bash|zsh|fish`: a completion script made from the argparse parser itself
(verbs, their flags and choices), so it cannot drift from the CLI; job names are asked of the
daemon as the user types (`supervise jobs --names`, nothing when no daemon answers), and `start`
also completes the specs in jobs/ and .toml files.

    eval "$(supervise completion bash)"                       # ~/.bashrc
    eval "$(supervise completion zsh)"                        # ~/.zshrc (after compinit)
    supervise completion fish > ~/.config/fish/completions/supervise.fish
"""

from __future__ import annotations

import argparse
import shlex

SHELLS = ("bash", "zsh", "fish")
# Verbs whose first positional argument is a job the daemon knows.
_JOB_VERBS = ("status", "logs", "events", "attempts", "stop", "restart", "hold", "release", "stack", "rm", "prune",
              "report")


def cmd_completion(args: argparse.Namespace) -> int:
    from supervisor.cli import _parser

    print(script(args.shell, _parser()))
    return 0


def _verbs(parser: argparse.ArgumentParser) -> dict[str, tuple[str, argparse.ArgumentParser]]:
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    helps = {c.dest: c.help or "" for c in sub._choices_actions}
    return {name: (helps.get(name, ""), p) for name, p in sub.choices.items()}


def _flags(parser: argparse.ArgumentParser) -> list[tuple[str, str, list[str]]]:
    """(option string, help, choices) for each flag of a verb."""
    found = []
    for action in parser._actions:
        for option in action.option_strings:
            found.append((option, (action.help or "").replace("\n", " "), [str(c) for c in action.choices or []]))
    return found


def _positional_choices(parser: argparse.ArgumentParser) -> list[str]:
    """The choices of a verb's positional argument (`completion bash|zsh|fish`), if it has some."""
    for action in parser._actions:
        if not action.option_strings and action.choices and not isinstance(action, argparse._SubParsersAction):
            return [str(c) for c in action.choices]
    return []


def script(shell: str, parser: argparse.ArgumentParser) -> str:
    verbs = _verbs(parser)
    if shell == "fish":
        return _fish(verbs)
    body = _bash(verbs)
    if shell == "zsh":  # zsh runs bash completions through its bashcompinit layer
        return "autoload -U +X bashcompinit && bashcompinit\n" + body
    return body


def _bash(verbs: dict[str, tuple[str, argparse.ArgumentParser]]) -> str:
    cases = []
    for name, (_, p) in verbs.items():
        flags = " ".join(option for option, _, _ in _flags(p))
        cases.append(f"    {name}) flags={shlex.quote(flags)} ;;")
    choices = []
    for name, (_, p) in verbs.items():
        for option, _, values in _flags(p):
            if values:
                choices.append(f"    {name}:{option}) COMPREPLY=($(compgen -W {shlex.quote(' '.join(values))} -- \"$cur\")); "
                               "return ;;")
    positional = [f"    {name}) COMPREPLY=($(compgen -W {shlex.quote(' '.join(values))} -- \"$cur\")); return ;;"
                  for name, (_, p) in verbs.items() if (values := _positional_choices(p))]
    return f"""# supervise completion for bash (made by `supervise completion bash`)
_supervise() {{
  local cur=${{COMP_WORDS[COMP_CWORD]}} prev=${{COMP_WORDS[COMP_CWORD-1]}}
  if [ "$COMP_CWORD" -eq 1 ]; then
    COMPREPLY=($(compgen -W {shlex.quote(' '.join(verbs))} -- "$cur")); return
  fi
  local verb=${{COMP_WORDS[1]}} flags=""
  case "$verb:$prev" in
{chr(10).join(choices) or "    __none__) ;;"}
  esac
  case "$verb" in
{chr(10).join(cases)}
  esac
  if [[ "$cur" == -* ]]; then COMPREPLY=($(compgen -W "$flags" -- "$cur")); return; fi
  case "$verb" in
{chr(10).join(positional) or "    __none__) ;;"}
  esac
  case "$verb" in
    {'|'.join(_JOB_VERBS)}) COMPREPLY=($(compgen -W "$(supervise jobs --names 2>/dev/null)" -- "$cur")) ;;
    start) COMPREPLY=($(compgen -W "$(supervise jobs --names --specs 2>/dev/null)" -- "$cur") $(compgen -f -X '!*.toml' -- "$cur")) ;;
  esac
}}
complete -o default -F _supervise supervise"""


def _fish(verbs: dict[str, tuple[str, argparse.ArgumentParser]]) -> str:
    lines = ["# supervise completion for fish (made by `supervise completion fish`)", "complete -c supervise -f"]
    for name, (help_, _) in verbs.items():
        lines.append(f"complete -c supervise -n __fish_use_subcommand -a {shlex.quote(name)} -d {shlex.quote(help_[:80])}")
    for name, (_, p) in verbs.items():
        for option, help_, values in _flags(p):
            flag = f"-l {shlex.quote(option[2:])}" if option.startswith("--") else f"-s {shlex.quote(option[1:])}"
            extra = f" -x -a {shlex.quote(' '.join(values))}" if values else ""
            lines.append(f"complete -c supervise -n {shlex.quote('__fish_seen_subcommand_from ' + name)} {flag}"
                         f" -d {shlex.quote(help_[:80])}{extra}")
    for name, (_, p) in verbs.items():
        if values := _positional_choices(p):
            lines.append(f"complete -c supervise -n {shlex.quote('__fish_seen_subcommand_from ' + name)} "
                         f"-a {shlex.quote(' '.join(values))}")
    jobs = " ".join(_JOB_VERBS)
    lines.append(f"complete -c supervise -n {shlex.quote('__fish_seen_subcommand_from ' + jobs)} "
                 "-a '(supervise jobs --names 2>/dev/null)'")
    lines.append("complete -c supervise -n '__fish_seen_subcommand_from start' "
                 "-a '(supervise jobs --names --specs 2>/dev/null) (__fish_complete_suffix .toml)'")
    return "\n".join(lines)
