"""`sluice completion bash|zsh`: a shell completion script for every command and option.

Made by shtab from the same parser `sluice` runs, so it cannot drift from the command line.
Install it once, e.g. `sluice completion bash > ~/.local/share/bash-completion/completions/sluice`
(bash) or `sluice completion zsh > "${fpath[1]}/_sluice"` (zsh).
"""

from __future__ import annotations

import argparse

SHELLS = ("bash", "zsh")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "completion",
        help="print a shell completion script (bash or zsh)",
        description=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("shell", choices=SHELLS, help="the shell to complete in")
    p.set_defaults(func=cmd_completion)


def cmd_completion(args: argparse.Namespace) -> int:
    import shtab

    from pipeline.cli import build_parser

    parser = build_parser()  # every command whose install is here
    print(shtab.complete(parser, shell=args.shell), end="")
    return 0
