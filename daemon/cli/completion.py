"""`flare-diag completion bash|zsh`: a shell completion script written from the command line's own
parser, so it cannot drift from the commands (no completion package at run time)."""

from __future__ import annotations

import argparse


def command_tree(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], list[str]]:
    """Each command path to the words that may follow it: its subcommands, then its options."""
    words: list[str] = []
    out: dict[tuple[str, ...], list[str]] = {}
    for a in parser._actions:  # argparse keeps no public list of a parser's actions
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                words.append(name)
                out.update(command_tree(sub, (*path, name)))
        else:
            words += [o for o in a.option_strings if o.startswith("--")]
    out[path] = words
    return out


def bash(parser: argparse.ArgumentParser) -> str:
    tree = command_tree(parser)
    cases = "\n".join(f'        "{" ".join(path)}") words="{" ".join(ws)}" ;;' for path, ws in sorted(tree.items()) if ws)
    return f"""# bash completion for flare-diag (written by `flare-diag completion bash`)
_flare_diag() {{
    local cur path="" w words i
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    # the command path so far: the words before the cursor that are not options or their values
    for ((i = 1; i < COMP_CWORD; i++)); do
        w="${{COMP_WORDS[i]}}"
        [[ "$w" == -* ]] && continue
        case "${{path:+$path }}$w" in
{chr(10).join(f'            "{" ".join(p)}") path="{" ".join(p)}" ;;' for p in sorted(tree) if p)}
        esac
    done
    case "$path" in
{cases}
        *) words="" ;;
    esac
    COMPREPLY=($(compgen -W "$words" -- "$cur"))
    [[ ${{#COMPREPLY[@]}} -eq 0 ]] && COMPREPLY=($(compgen -f -- "$cur"))
    return 0
}}
complete -F _flare_diag flare-diag
"""


def zsh(parser: argparse.ArgumentParser) -> str:
    return "#compdef flare-diag\nautoload -U bashcompinit && bashcompinit\n" + bash(parser)
