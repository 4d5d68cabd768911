"""What a machine needs to host a lab: root with CAP_NET_ADMIN, iproute2, util-linux, OpenSSH (client and sshd).
`check_requirements()` raises a LabError that says what to do; `why_not()` returns that sentence, or None."""
from __future__ import annotations

import os
import shutil

from kit.netlab import ssh as netlab_ssh
from kit.netlab.system import LabError, _has_net_admin


def check_requirements():
    """Raise LabError saying what to do when this machine cannot host a lab (no root, no ip/tc, no sshd)."""
    if os.geteuid() != 0 or not _has_net_admin():
        raise LabError("kit.netlab needs root (CAP_NET_ADMIN) to make network namespaces: run as root, or in "
                       "Docker with `--cap-add NET_ADMIN --cap-add SYS_ADMIN`")
    for tool, package in (("ip", "iproute2"), ("tc", "iproute2"), ("unshare", "util-linux"),
                          ("ssh", "openssh-client"), ("ssh-keygen", "openssh-client")):
        if not shutil.which(tool):
            raise LabError(f"`{tool}` not found: install Debian's {package} (apt-get install -y {package})")
    netlab_ssh.find_sshd()


def why_not() -> str | None:
    """Return None when this machine can host a lab, else the reason (the LabError's text): notebooks' lab cells
    show the committed results with that sentence instead of raising (not root, root without NET_ADMIN, no sshd)."""
    try:
        check_requirements()
    except LabError as e:
        return str(e)
    return None
