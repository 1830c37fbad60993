"""A call's list, dict and set arguments under `code_tests`, as in one Python process: what the
program does to them the tests see (a sort in place, a rotation, an item added), and one it
returns, or holds in what it returns, is the tests' own object. So a program that edits an
input the tests keep, or returns its input for a copy, fails; one that works in place passes.
An object of the program's that reaches the tests twice is one object there (`is`, `==`).

A row is (tests, wrong program, right program): the wrong one scores 0, the right one 1."""

from __future__ import annotations

import pytest
from helpers.programs import fenced

from oncurve.rewards.code import CodeTestsReward

DEEP_COPY_TESTS = [
    "original = [[1, 2], [3]]\ncopied = deep_copy(original)\nassert copied == original\n"
    "assert copied is not original\nassert copied[0] is not original[0]"
]
RIGHT_DEEP_COPY = "def deep_copy(x):\n    return [list(row) for row in x]\n"

PERSON = "class P:\n    def __init__(self, name, age):\n        self.name, self.age = name, age\n\n"
SHAPES = "class Square:\n    pass\n\nclass Circle:\n    pass\n\n"
TREE = (
    "class Node:\n    def __init__(self, v):\n        self.v, self.children = v, []\n"
    "    def add(self, c):\n        self.children.append(c)\n"
)
NODE = "class ListNode:\n    def __init__(self, val):\n        self.val, self.next = val, None\n\n"

ROWS = {
    # wrong programs the tests' own objects catch
    "a copy that returns its input": (
        DEEP_COPY_TESTS,
        "def deep_copy(x):\n    return x\n",
        RIGHT_DEEP_COPY,
    ),
    "a shallow copy for a deep one": (
        DEEP_COPY_TESTS,
        "def deep_copy(x):\n    return list(x)\n",
        RIGHT_DEEP_COPY,
    ),
    "a sort that edits the input the tests keep": (
        ["data = [3, 1, 2]\nassert sorted_copy(data) == [1, 2, 3]\nassert data == [3, 1, 2]"],
        "def sorted_copy(xs):\n    xs.sort()\n    return xs\n",
        "def sorted_copy(xs):\n    return sorted(xs)\n",
    ),
    "an input emptied by pop": (
        ["data = [5, 3, 9]\nassert largest(data) == 9\nassert data == [5, 3, 9]"],
        "def largest(xs):\n    xs.sort()\n    return xs.pop()\n",
        "def largest(xs):\n    return max(xs)\n",
    ),
    "a dict edited and returned": (
        ["d = {'a': 1}\nassert with_b(d) == {'a': 1, 'b': 2}\nassert d == {'a': 1}"],
        "def with_b(d):\n    d['b'] = 2\n    return d\n",
        "def with_b(d):\n    return {**d, 'b': 2}\n",
    ),
    # right programs that work in place
    "a rotation in place": (
        ["m = [[1, 2], [3, 4]]\nrotate(m)\nassert m == [[3, 1], [4, 2]]"],
        "def rotate(m):\n    return [list(r) for r in zip(*m[::-1])]\n",
        "def rotate(m):\n    m[:] = [list(r) for r in zip(*m[::-1])]\n",
    ),
    "a row edited in place": (
        [
            "m = [[1, 2], [3, 4]]\nrow = m[0]\nzero_first(m)\nassert row == [0, 2]\n"
            "assert m[0] is row"
        ],
        "def zero_first(m):\n    m[0] = [0, 2]\n",
        "def zero_first(m):\n    m[0][0] = 0\n",
    ),
    "a sort in place": (
        ["nums = [2, 0, 1, 0]\nassert sort_colors(nums) is None\nassert nums == [0, 0, 1, 2]"],
        "def sort_colors(nums):\n    nums = sorted(nums)\n",
        "def sort_colors(nums):\n    nums.sort()\n",
    ),
    "a set and a dict filled in place": (
        ["s, d = {1}, {}\nfill(s, counts=d)\nassert s == {1, 2}\nassert d == {'n': 2}"],
        "def fill(s, counts):\n    s = s | {2}\n    counts = {'n': 2}\n",
        "def fill(s, counts):\n    s.add(2)\n    counts['n'] = len(s)\n",
    ),
    "the input returned as itself": (
        ["xs = [1, 2]\nassert same(xs) is xs\nassert pair(xs)[1] is xs"],
        "def same(xs):\n    return list(xs)\n\ndef pair(xs):\n    return (0, list(xs))\n",
        "def same(xs):\n    return xs\n\ndef pair(xs):\n    return (0, xs)\n",
    ),
    "one list in two places": (
        ["row = [1]\ngrid = [row, row]\ngrow(grid)\nassert row == [1, 2]\nassert grid[1] is row"],
        "def grow(grid):\n    grid[0] = grid[0] + [2]\n",
        "def grow(grid):\n    grid[0].append(2)\n",
    ),
    "an edit before an error": (
        [
            "data = []\ntry:\n    push_then_fail(data)\nexcept ValueError:\n    pass\n"
            "assert data == [1]"
        ],
        "def push_then_fail(xs):\n    raise ValueError\n",
        "def push_then_fail(xs):\n    xs.append(1)\n    raise ValueError\n",
    ),
    "a list of the program's objects passed back beside the tests' list": (
        ["nodes = make()\nseen = []\ncount(nodes, seen)\nassert seen == [2]"],
        "class Node:\n    pass\n\ndef make():\n    return [Node(), Node()]\n\n"
        "def count(nodes, seen):\n    seen.append(3)\n",
        "class Node:\n    pass\n\ndef make():\n    return [Node(), Node()]\n\n"
        "def count(nodes, seen):\n    seen.append(len(nodes))\n",
    ),
    "a named tuple's list": (
        [
            "from collections import namedtuple\nP = namedtuple('P', 'xs y')\np = P([1], 2)\n"
            "push(p)\nassert p.xs == [1, 0]"
        ],
        "def push(p):\n    return p[0] + [0]\n",
        "def push(p):\n    p[0].append(0)\n",
    ),
    "a list of the program's objects sorted in place": (
        [
            "ps = [P('a', 30), P('b', 20)]\nsort_by_age(ps)\nassert [p.name for p in ps] == ['b', 'a']"
        ],
        PERSON + "def sort_by_age(ps):\n    return sorted(ps, key=lambda p: p.age)\n",
        PERSON + "def sort_by_age(ps):\n    ps.sort(key=lambda p: p.age)\n",
    ),
    "an input changed by adding a function to it": (
        ["xs = [1, 2]\nassert total(xs) == 3\nassert xs == [1, 2]"],
        "def total(xs):\n    xs.append(lambda: 0)\n    return 3\n",
        "def total(xs):\n    return sum(xs)\n",
    ),
    # the program's objects keep their identity in the tests
    "a node found again is the tests' node": (
        [
            "a, b, c = ListNode(1), ListNode(2), ListNode(3)\na.next = b\nb.next = c\nc.next = b\n"
            "assert detect_cycle(a) is b\nassert detect_cycle(a) == b\nassert a.next is b"
        ],
        NODE + "def detect_cycle(head):\n    return head.next.next\n",
        NODE + "def detect_cycle(head):\n    seen = set()\n    while head not in seen:\n"
        "        seen.add(head)\n        head = head.next\n    return head\n",
    ),
    # the standard library's containers, as lists, dicts and sets
    "a defaultdict graph filled in place": (
        [
            "from collections import defaultdict\ng = defaultdict(list)\nadd_edge(g, 1, 2)\n"
            "add_edge(g, 2, 3)\nassert g[2] == [1, 3] and g[1] == [2]\nassert g[9] == []"
        ],
        "def add_edge(g, u, v):\n    g = dict(g)\n    g.setdefault(u, []).append(v)\n",
        "def add_edge(g, u, v):\n    g[u].append(v)\n    g[v].append(u)\n",
    ),
    "a defaultdict of a lambda returned": (
        ["assert count_words('a b a') == {'a': 2, 'b': 1}"],
        "def count_words(s):\n    return {w: 1 for w in s.split()}\n",
        "from collections import defaultdict\n\ndef count_words(s):\n"
        "    counts = defaultdict(lambda: 0)\n    for w in s.split():\n        counts[w] += 1\n"
        "    return counts\n",
    ),
    "a Counter counted into": (
        [
            "from collections import Counter\nc = Counter(a=1)\ncount_into(c, ['a', 'b', 'a'])\n"
            "assert c == Counter(a=3, b=1)\nassert c.most_common(1) == [('a', 3)]"
        ],
        "def count_into(c, words):\n    return c + type(c)(words)\n",
        "def count_into(c, words):\n    c.update(words)\n",
    ),
    "a deque pushed to and rotated": (
        [
            "from collections import deque\nq = deque([1], maxlen=3)\npush_all(q, [2, 3, 4])\n"
            "assert list(q) == [3, 4, 2] and q.maxlen == 3"
        ],
        "def push_all(q, xs):\n    q = q + type(q)(xs)\n    q.rotate(-1)\n",
        "def push_all(q, xs):\n    q.extend(xs)\n    q.rotate(-1)\n",
    ),
    "an OrderedDict reordered": (
        [
            "from collections import OrderedDict\nd = OrderedDict(a=1, b=2, c=3)\ntouch(d, 'a')\n"
            "assert list(d) == ['b', 'c', 'a']"
        ],
        "def touch(d, k):\n    d = dict(d)\n    d[k] = d.pop(k)\n",
        "def touch(d, k):\n    d.move_to_end(k)\n",
    ),
    "a deque kept while its first item is read": (
        [
            "from collections import deque\nq = deque([1, 2])\nassert first(q) == 1\n"
            "assert list(q) == [1, 2]"
        ],
        "def first(q):\n    return q.popleft()\n",
        "def first(q):\n    return q[0]\n",
    ),
    "a deque returned for a copy": (
        [
            "from collections import deque\nq = deque([[1], [2]])\nc = copy_queue(q)\n"
            "assert c == q and c is not q and c[0] is q[0]\nassert same_queue(q) is q"
        ],
        "def copy_queue(q):\n    return q\n\ndef same_queue(q):\n    return q\n",
        "def copy_queue(q):\n    return q.copy()\n\ndef same_queue(q):\n    return q\n",
    ),
    "a dict of deques, one of them shared": (
        [
            "from collections import deque\nq = deque()\nqs = {'a': q, 'b': q}\nenqueue(qs, 'a', 5)\n"
            "assert qs['b'] is q and list(q) == [5]"
        ],
        "def enqueue(qs, k, x):\n    qs[k] = type(qs[k])([x])\n",
        "def enqueue(qs, k, x):\n    qs[k].append(x)\n",
    ),
    # what a call both puts into an argument and returns is one object in the tests
    "a child added to a dict tree and returned": (
        [
            "root = {'val': 1, 'children': []}\nc = add_child(root, 2)\nadd_child(c, 3)\n"
            "assert root['children'][0]['children'][0]['val'] == 3\nassert root['children'][0] is c"
        ],
        "def add_child(node, val):\n    child = {'val': val, 'children': []}\n"
        "    node['children'].append(child)\n    return dict(child)\n",
        "def add_child(node, val):\n    child = {'val': val, 'children': []}\n"
        "    node['children'].append(child)\n    return child\n",
    ),
    "a row appended and returned": (
        ["m = [[1, 2]]\nr = add_row(m)\nr[0] = 5\nassert m == [[1, 2], [5, 0]]"],
        "def add_row(m):\n    row = [0, 0]\n    m.append(row)\n    return list(row)\n",
        "def add_row(m):\n    row = [0, 0]\n    m.append(row)\n    return row\n",
    ),
    "a list of the program's classes sorted in place": (
        [
            "kinds = [Square, Circle]\nassert names(kinds) == ['Circle', 'Square']\n"
            "assert kinds[0] is Square"
        ],
        SHAPES + "def names(ks):\n    ks.sort(key=lambda k: k.__name__)\n"
        "    return [k.__name__ for k in ks]\n",
        SHAPES + "def names(ks):\n    return sorted(k.__name__ for k in ks)\n",
    ),
    # a buffer is no bytes: marshal would have sent it as bytes
    "an array returned where the tests expect bytes": (
        ["assert to_bytes([104, 105]) == b'hi'"],
        "from array import array\n\ndef to_bytes(xs):\n    return array('B', xs)\n",
        "def to_bytes(xs):\n    return bytearray(xs)\n",  # equal to bytes, as in one process
    ),
    # a list of the program's objects is one live object of the program's
    "a list of the program's objects given out for a copy": (
        [
            "r = Node(1)\nr.add(Node(2))\nkids = r.get_children()\nkids.append(Node(3))\n"
            "assert len(r.get_children()) == 1"
        ],
        TREE + "    def get_children(self):\n        return self.children\n",
        TREE + "    def get_children(self):\n        return list(self.children)\n",
    ),
    "a list of the program's objects the tests add to": (
        [
            "r = Node(1)\nr.add(Node(2))\nr.children.append(Node(3))\nr.children[0].add(Node(5))\n"
            "kids = r.children\nr.add(Node(4))\n"
            "assert count(r) == 5 and len(kids) == 3 and r.children is r.children"
        ],
        TREE + "def count(n):\n    return 1 + len(n.children)\n",
        TREE + "def count(n):\n    return 1 + sum(count(c) for c in n.children)\n",
    ),
    "a pytest file's in-place test": (
        "from solution import reverse_in_place\n\ndef test_reverse():\n    s = ['a', 'b', 'c']\n"
        "    reverse_in_place(s)\n    assert s == ['c', 'b', 'a']\n",
        "def reverse_in_place(s):\n    s = s[::-1]\n",
        "def reverse_in_place(s):\n    s.reverse()\n",
    ),
}


@pytest.fixture(scope="module")
def reward() -> CodeTestsReward:
    return CodeTestsReward(workers=2, timeout_s=3.0, memory_mb=256)


@pytest.mark.parametrize(("tests", "wrong", "right"), ROWS.values(), ids=ROWS.keys())
def test_a_calls_arguments_are_the_tests_own_objects(reward, tests, wrong, right):
    scores = reward([""] * 2, [fenced(wrong), fenced(right)], tests=[tests] * 2)
    assert scores == [0.0, 1.0]
