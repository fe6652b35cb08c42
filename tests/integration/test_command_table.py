"""Ferry's generated command table (proxy/base/command_table.h) against a live
redis-server's COMMAND reply: the same commands and subcommands, with the same
arity, legacy key positions and flags. The header is parsed as text, so the
test needs no build.

Run: cd tests/integration && python3 -m unittest test_command_table -v
"""
import os
import re
import unittest

from harness import RedisServer

HEADER = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), 'proxy', 'base', 'command_table.h')

ARRAY_RE = re.compile(r'^static const command (\w+)\[[^\]]*\] = \{$')
ENTRY_RE = re.compile(
    r'^\s*\{"([a-z0-9_|-]+)", (-?\d+), (-?\d+), (-?\d+), (-?\d+), ([A-Z0-9_ |]+), '
    r'(CMD_[A-Z]+), (NULL|\w+), (\d+)\},$')
CLASSES = {'CMD_STATELESS', 'CMD_BLOCKING', 'CMD_PUBSUB', 'CMD_TRANSACTION',
           'CMD_CONNSTATE', 'CMD_DENIED', 'CMD_LOCAL'}

_server = None
_live = None  # name -> entry dict, subcommands included as "container|sub"
_live_subs = None  # container -> set of subcommand names
_version = None


def parse_flags(expr):
    if expr.strip() == '0':
        return frozenset()
    flags = set()
    for macro in expr.split('|'):
        macro = macro.strip()
        if not macro.startswith('CMD_F_'):
            raise AssertionError('unexpected flag expression %r' % expr)
        flags.add(macro[len('CMD_F_'):].lower())
    return frozenset(flags)


def parse_header(path):
    """-> (arrays: name -> list of entry dicts, defines: name -> value)."""
    arrays = {}
    defines = {}
    current = None
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip('\n')
            m = re.match(r'^#define (\w+) (\w+)', line)
            if m:
                defines[m.group(1)] = m.group(2)
                continue
            if current is None:
                m = ARRAY_RE.match(line)
                if m:
                    current = arrays.setdefault(m.group(1), [])
                continue
            if line == '};':
                current = None
                continue
            m = ENTRY_RE.match(line)
            if not m:
                raise AssertionError('%s:%d: unparsable entry: %s' % (path, lineno, line))
            current.append({
                'name': m.group(1),
                'arity': int(m.group(2)),
                'first': int(m.group(3)),
                'last': int(m.group(4)),
                'step': int(m.group(5)),
                'flags': parse_flags(m.group(6)),
                'cls': m.group(7),
                'sub': None if m.group(8) == 'NULL' else m.group(8),
                'nsub': int(m.group(9)),
            })
    return arrays, defines


def live_entry(raw):
    return {
        'name': raw[0].lower(),
        'arity': int(raw[1]),
        'first': int(raw[3]),
        'last': int(raw[4]),
        'step': int(raw[5]),
        'flags': frozenset(f.lower() for f in raw[2]),
    }


def setUpModule():
    global _server, _live, _live_subs, _version
    _server = RedisServer()
    client = _server.client()
    try:
        _version = client.info('server')['redis_version']
        # Raw reply: redis-py's COMMAND callback would reshape it.
        conn = client.connection_pool.get_connection('COMMAND')
        try:
            conn.send_command('COMMAND')
            reply = conn.read_response()
        finally:
            client.connection_pool.release(conn)
    finally:
        client.close()
    _live = {}
    _live_subs = {}
    for raw in reply:
        entry = live_entry(raw)
        _live[entry['name']] = entry
        subs = raw[9] if len(raw) > 9 and raw[9] else []
        _live_subs[entry['name']] = set()
        for sub_raw in subs:
            sub = live_entry(sub_raw)
            _live[sub['name']] = sub
            _live_subs[entry['name']].add(sub['name'])


def tearDownModule():
    if _server is not None:
        _server.stop()


class CommandTableTest(unittest.TestCase):
    longMessage = False  # the collected differences are the message

    def setUp(self):
        self.arrays, self.defines = parse_header(HEADER)
        self.assertIn('command_entries', self.arrays, 'no command_entries array in the header')
        self.top = self.arrays['command_entries']
        self.table = {}
        for entry in self.top:
            self.table[entry['name']] = entry
            if entry['sub'] is not None:
                self.assertIn(entry['sub'], self.arrays,
                              '%s refers to missing array %s' % (entry['name'], entry['sub']))
                for sub in self.arrays[entry['sub']]:
                    self.table[sub['name']] = sub

    def context(self):
        return ' (live server: Redis %s; regenerate with scripts/gen-commands)' % _version

    def test_header_is_generated(self):
        with open(HEADER) as f:
            head = f.read(400)
        self.assertIn('scripts/gen-commands', head)
        self.assertIn('Do not edit by hand', head)

    def test_same_top_level_commands(self):
        live = {n for n in _live if '|' not in n}
        ours = {e['name'] for e in self.top}
        self.assertEqual(len(ours), len(self.top), 'duplicate names in command_entries')
        msg = []
        if live - ours:
            msg.append('missing from the table: ' + ' '.join(sorted(live - ours)))
        if ours - live:
            msg.append('not in COMMAND: ' + ' '.join(sorted(ours - live)))
        self.assertFalse(msg, '; '.join(msg) + self.context())
        self.assertEqual(int(self.defines['COMMAND_TABLE_COUNT']), len(self.top))

    def test_same_subcommands(self):
        diffs = []
        total = 0
        for entry in self.top:
            name = entry['name']
            ours = set()
            if entry['sub'] is not None:
                subs = self.arrays[entry['sub']]
                if entry['nsub'] != len(subs):
                    diffs.append('%s: nsub %d but %d entries' % (name, entry['nsub'], len(subs)))
                ours = {s['name'] for s in subs}
                total += len(subs)
            elif entry['nsub'] != 0:
                diffs.append('%s: nsub %d without an array' % (name, entry['nsub']))
            live = _live_subs.get(name, set())
            if ours != live:
                diffs.append('%s: missing %s, extra %s' % (
                    name, sorted(live - ours), sorted(ours - live)))
        self.assertFalse(diffs, '\n'.join(diffs) + self.context())
        self.assertEqual(int(self.defines['COMMAND_TABLE_SUB_COUNT']), total)

    def test_same_arity_keys_flags(self):
        diffs = []
        for name in sorted(set(self.table) & set(_live)):
            ours, live = self.table[name], _live[name]
            for field in ('arity', 'first', 'last', 'step'):
                if ours[field] != live[field]:
                    diffs.append('%s: %s %d, COMMAND says %d' % (
                        name, field, ours[field], live[field]))
            if ours['flags'] != live['flags']:
                diffs.append('%s: flags missing %s, extra %s' % (
                    name, sorted(live['flags'] - ours['flags']),
                    sorted(ours['flags'] - live['flags'])))
        self.assertFalse(diffs, '\n'.join(diffs) + self.context())

    def test_sorted_and_classified(self):
        names = [e['name'] for e in self.top]
        self.assertEqual(names, sorted(names, key=lambda n: n.encode()))
        for entry in self.top:
            if entry['sub'] is not None:
                subs = [s['name'] for s in self.arrays[entry['sub']]]
                self.assertEqual(subs, sorted(subs, key=lambda n: n.encode()), entry['name'])
        for name, entry in self.table.items():
            self.assertIn(entry['cls'], CLASSES, name)
        expect = {'get': 'CMD_STATELESS', 'blpop': 'CMD_BLOCKING', 'xread': 'CMD_BLOCKING',
                  'script|kill': 'CMD_BLOCKING', 'wait': 'CMD_STATELESS',
                  'subscribe': 'CMD_PUBSUB', 'multi': 'CMD_TRANSACTION',
                  'client|setname': 'CMD_CONNSTATE', 'config|rewrite': 'CMD_DENIED',
                  'config|set': 'CMD_STATELESS', 'hello': 'CMD_LOCAL'}
        for name, cls in expect.items():
            self.assertEqual(self.table[name]['cls'], cls, name)


if __name__ == '__main__':
    unittest.main()
