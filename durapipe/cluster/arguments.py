"""The options every command that talks to a cluster takes (argparse only, so that a command
line that merely lists them imports nothing else)."""

from __future__ import annotations

import argparse


def add_connection_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "--namespace", metavar="NS",
                        help="namespace (default: the file's, else the kubeconfig context's)")
    parser.add_argument("--kubeconfig", metavar="FILE",
                        help="kubeconfig file (default $KUBECONFIG, then ~/.kube/config)")
    parser.add_argument("--context", metavar="NAME", help="kubeconfig context to use")
