"""proxy/'s folders are its layers (docs/architecture.md, "What each layer may
call"): a function of a folder is called only from its own folder or from a
folder above it. The calls are found as a reader would find them: every
exported function and global of the tree (universal-ctags), then every file
that names one defined in another folder. No Redis, no ferry process.

A failure names the file, the function it calls and the folders: either the
call goes through the ops table its owner set, or the file sits in the wrong
folder (move it, and say so in docs/architecture.md).
"""

import json
import os
import re
import shutil
import subprocess
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Bottom to top. Folders of one rank are one layer and may call each other
# (the queue features are on the router's layer). sentinel/ and cluster/
# sit beside the shard, below it; config/ and cluster/slot.c at the bottom.
RANK = {
    'config': 0, 'proxy/base': 0, 'cluster/slot.c': 0,
    'proxy/loops': 1,
    'sentinel': 2, 'cluster': 2,
    'proxy/link': 3,
    'proxy/shard': 4,
    'proxy/store': 5,
    'proxy/router': 6, 'proxy/queue': 6,
    'proxy/session': 7,
    'proxy/ops': 8,
    'proxy/core': 9,
}
TREES = ('proxy', 'sentinel', 'cluster', 'config')

IDENT = re.compile(r'\b[A-Za-z_]\w*\b')
STRIP = re.compile(r'/\*.*?\*/|//[^\n]*|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)


def ctags():
    for name in ('ctags-universal', 'universal-ctags', 'ctags'):
        path = shutil.which(name)
        if path:
            return path
    return None


def place(path):
    """The RANK key of a file: itself where it has one, else its folder."""
    rel = os.path.relpath(path, ROOT)
    if rel in RANK:
        return rel
    return os.path.dirname(rel)


def sources():
    out = []
    for tree in TREES:
        for root, _, names in os.walk(os.path.join(ROOT, tree)):
            out += [os.path.join(root, n) for n in sorted(names) if n.endswith('.c')]
    return out


class LayerTest(unittest.TestCase):
    def setUp(self):
        self.ctags = ctags()
        # scripts/setup installs universal-ctags: without it this test fails,
        # it does not skip.
        self.assertIsNotNone(self.ctags, 'universal-ctags not installed (scripts/setup)')

    def test_every_folder_is_ranked(self):
        folders = {place(p) for p in sources()}
        self.assertEqual(sorted(f for f in folders if f not in RANK), [],
                         'a folder with C files that docs/architecture.md\'s table does not name')
        proxy = sorted(d for d in os.listdir(os.path.join(ROOT, 'proxy'))
                       if os.path.isdir(os.path.join(ROOT, 'proxy', d)))
        loose = sorted(n for n in os.listdir(os.path.join(ROOT, 'proxy'))
                       if not os.path.isdir(os.path.join(ROOT, 'proxy', n)))
        self.assertEqual(loose, [], 'files directly in proxy/: each belongs to a layer folder')
        for d in proxy:
            self.assertTrue(os.path.exists(os.path.join(ROOT, 'proxy', d, 'README.md')),
                            'proxy/%s has no README.md' % d)

    def test_calls_go_down(self):
        srcs = sources()
        out = subprocess.run([self.ctags, '--output-format=json', '--kinds-C=fv',
                              '--fields=+S{file}', '-f', '-'] + srcs,
                             capture_output=True, text=True, check=True).stdout
        owner = {}
        for line in out.splitlines():
            tag = json.loads(line)
            if tag.get('_type') != 'tag' or tag.get('file'):   # file: a static definition
                continue
            owner.setdefault(tag['name'], tag['path'])
        self.assertGreater(len(owner), 500, 'ctags found too few definitions: %d' % len(owner))
        upward = []
        calls = 0
        for src in srcs:
            with open(src, errors='replace') as f:
                text = STRIP.sub(' ', f.read())
            for name in sorted(set(IDENT.findall(text))):
                o = owner.get(name)
                if not o or o == src:
                    continue
                calls += 1
                a, b = place(src), place(o)
                if RANK[a] < RANK[b]:
                    upward.append('%s (%s) calls %s of %s (%s)' % (
                        os.path.relpath(src, ROOT), a, name, os.path.relpath(o, ROOT), b))
        self.assertGreater(calls, 1000)
        self.assertEqual(upward, [], 'calls up the layers:\n' + '\n'.join(upward))


if __name__ == '__main__':
    unittest.main()
