"""python3 timed.py [unittest arguments]: unittest's own main, then the
slowest tests and classes (a class from its first test's start to the next
class's, so its setUpClass and tearDownClass count), to watch the suite's
time as it grows. Exit status: 0 when every test passed, else 1."""
import sys
import time
import unittest

SLOWEST = 25


class TimedResult(unittest.TextTestResult):
    tests = {}    # test id -> seconds
    classes = {}  # class -> [start, end]
    current = None

    def startTest(self, test):
        now = time.monotonic()
        cls = '%s.%s' % (type(test).__module__, type(test).__qualname__)
        if cls != TimedResult.current:
            if TimedResult.current is not None:
                TimedResult.classes[TimedResult.current][1] = now
            TimedResult.classes.setdefault(cls, [now, now])
            TimedResult.current = cls
        self._t0 = now
        super().startTest(test)

    def stopTest(self, test):
        super().stopTest(test)
        TimedResult.tests[test.id()] = time.monotonic() - self._t0


def table(title, rows):
    print('==== %s ====' % title, file=sys.stderr)
    for seconds, name in sorted(rows, reverse=True)[:SLOWEST]:
        print('%8.1f  %s' % (seconds, name), file=sys.stderr)


def main():
    t0 = time.monotonic()
    runner = unittest.TextTestRunner(resultclass=TimedResult, verbosity=2)
    prog = unittest.main(module=None, testRunner=runner, exit=False)
    if TimedResult.current is not None:
        TimedResult.classes[TimedResult.current][1] = time.monotonic()
    table('slowest tests (s)', [(v, k) for k, v in TimedResult.tests.items()])
    table('slowest classes (s, setUpClass included)',
          [(e - s, k) for k, (s, e) in TimedResult.classes.items()])
    print('==== %d test(s) in %.0f s ====' % (len(TimedResult.tests), time.monotonic() - t0),
          file=sys.stderr)
    sys.exit(0 if prog.result.wasSuccessful() else 1)


if __name__ == '__main__':
    main()
