"""Training prompts for self-distillation, built offline: instructions about Python's standard library
(its modules, functions and classes, read from the running interpreter's own sources and docstrings),
general questions, writing tasks and reasoning problems, each kind from its own templates and word
lists, deduplicated and shuffled from a seed. Evaluation prompts come from another source (the
hand-written `peagle_vllm/data/eval_prompts.json`). A second source, everyday requests phrased many ways, is in
`requests.py`, a third, questions on yet other subjects, in `questions.py`; `training_prompts` draws from any of
them and leaves out any built prompt that is also an evaluation message, so acceptance is measured on prompts no
head saw.
"""

from __future__ import annotations

import ast
import json
import random
import re
import sys
from collections.abc import Iterator
from pathlib import Path

from peagle_vllm.train.draw import draw_distinct
from peagle_vllm.train.questions import build_questions
from peagle_vllm.train.requests import build_requests

EVAL_PROMPTS = Path(__file__).resolve().parent.parent / "data" / "eval_prompts.json"  # the held-out user messages

# words that frame a request rather than name its subject ("What is the difference between ... in Python?")
FRAME = set("a an the in of to and or is are do does i how what why with for my me on it that this you can python "
            "write show explain from by as be at which when your difference between function program script class "
            "short simple example examples use using some give tell make".split())


def subject_words(message: str) -> set[str]:
    """The stems (first 5 letters) of a message's words that are not FRAME words."""
    return {word[:5] for word in re.findall(r"[a-z0-9_*=]+", message.lower()) if word not in FRAME}


def subject_overlap(a: str, b: str) -> float:
    """Jaccard overlap of two messages' subject words: near 1 for the same request in other framing words."""
    ours, theirs = subject_words(a), subject_words(b)
    return len(ours & theirs) / len(ours | theirs) if ours | theirs else 1.0


SKIP_MODULES = {"antigravity", "this", "idlelib", "turtledemo", "lib2to3", "test", "tkinter", "turtle", "distutils",
                "ensurepip", "venv", "pydoc_data", "xxsubtype", "xxlimited", "xxlimited_35"}

STDLIB_TEMPLATES = (
    "What does `{name}` in Python's `{module}` module do? Give a short example.",
    "Show me how to use `{module}.{name}` with a small code example.",
    "Write a Python function that uses `{module}.{name}` and explain each line.",
    "Explain the parameters of `{module}.{name}` and when I would use it.",
    "I am new to Python. How do I use `{name}` from the `{module}` module?",
    "What is a common mistake when using `{module}.{name}`, and how do I avoid it?",
    "Compare `{module}.{name}` with doing the same thing by hand in Python.",
)
DOC_TEMPLATES = (
    "In Python, how can I {doc}?",
    "Write a Python snippet to {doc}.",
    "Which standard-library function would you use to {doc}? Show an example.",
)
MODULE_TEMPLATES = (
    "Give an overview of Python's `{module}` module with two examples.",
    "What problems does the `{module}` module in Python's standard library solve?",
    "Write a short tutorial on the `{module}` module for a beginner.",
    "List the most useful functions of the `{module}` module and what each one does.",
    "Write a small Python script that demonstrates the `{module}` module.",
)
CODING_TASKS = (
    "reverses a string", "checks whether a number is prime", "counts the vowels in a sentence",
    "returns the n-th Fibonacci number", "merges two sorted lists", "removes duplicates from a list while keeping order",
    "finds the longest word in a text", "converts Celsius to Fahrenheit", "checks whether a string is a palindrome",
    "flattens a nested list", "computes the factorial of a number", "sorts a list of dictionaries by a key",
    "reads a CSV file and sums one column", "counts word frequencies in a text", "validates an email address",
    "finds the second largest number in a list", "transposes a matrix", "computes the greatest common divisor",
    "groups a list of words by their first letter", "chunks a list into pieces of size n", "parses a date string",
    "generates a random password", "computes the average of a list of numbers", "finds all anagrams in a word list",
    "implements binary search", "implements a stack class", "implements a queue with two stacks",
    "rotates a list by k positions", "checks whether two strings are anagrams", "counts the lines in a file",
    "converts a Roman numeral to an integer", "converts an integer to binary", "finds the missing number in a range",
    "capitalizes every word in a sentence", "computes the running total of a list", "finds common elements of two lists",
    "implements bubble sort", "implements merge sort", "implements quicksort", "checks balanced parentheses",
    "returns the digits of a number", "computes the median of a list", "formats a number with thousands separators",
    "writes a dictionary to a JSON file", "retries a function call three times", "times how long a function takes",
    "downloads nothing but builds a URL with query parameters", "computes the dot product of two vectors",
    "finds the most common element in a list", "splits a full name into first and last name",
)
CODING_TEMPLATES = (
    "Write a Python function that {task}.",
    "Write a Python function that {task}. Add a docstring and a test.",
    "How would you write a program that {task}? Use Python.",
    "Explain step by step how to write code that {task}.",
    "Write a JavaScript function that {task}.",
)
TOPICS = (
    "photosynthesis", "the water cycle", "black holes", "the French Revolution", "climate change", "vaccines",
    "the internet", "machine learning", "the Roman Empire", "volcanoes", "earthquakes", "the human heart",
    "the immune system", "renewable energy", "solar panels", "electric cars", "the stock market", "inflation",
    "democracy", "the printing press", "the industrial revolution", "the moon landing", "DNA", "evolution",
    "plate tectonics", "the ocean tides", "rainbows", "the seasons", "gravity", "magnetism", "electricity",
    "the periodic table", "chemical reactions", "the solar system", "Mars", "Jupiter", "comets", "dinosaurs",
    "bees", "coral reefs", "rainforests", "deserts", "the Arctic", "migration of birds", "sleep", "nutrition",
    "exercise", "meditation", "stress", "memory", "learning a language", "music theory", "jazz", "the violin",
    "painting", "photography", "architecture", "the Great Wall of China", "the pyramids of Egypt", "Shakespeare",
    "poetry", "novels", "mythology", "philosophy", "ethics", "economics", "supply and demand", "taxes", "banking",
    "cryptocurrency", "cybersecurity", "passwords", "encryption", "cloud computing", "databases", "operating systems",
    "smartphones", "social media", "video games", "robots", "3D printing", "space travel", "satellites", "GPS",
    "airplanes", "trains", "bicycles", "cities", "farming", "bread baking", "coffee", "tea", "chocolate",
    "recycling", "plastic pollution", "air quality", "clean water", "public health", "first aid", "time management",
    "job interviews", "teamwork", "leadership", "public speaking", "budgeting", "saving money", "starting a business",
    "marketing", "customer service", "remote work", "gardening", "houseplants", "composting", "dogs", "cats",
    "horses", "whales", "sharks", "octopuses", "ants", "butterflies", "trees", "mushrooms", "weather forecasts",
    "hurricanes", "snow", "glaciers", "rivers", "mountains", "islands", "maps", "the Olympic Games", "football",
    "chess", "board games", "libraries", "museums", "newspapers", "the English language", "grammar", "mathematics",
    "prime numbers", "probability", "statistics", "geometry", "algebra", "calculus", "the metric system", "clocks",
    "calendars", "holidays", "friendship", "kindness", "curiosity", "the scientific method", "telescopes",
    "microscopes", "bacteria", "viruses", "antibiotics", "the brain", "the eye", "sound", "light", "color",
)
GENERAL_TEMPLATES = (
    "Explain {topic} to a ten-year-old.", "What are three interesting facts about {topic}?",
    "Give me a short summary of {topic}.", "Why is {topic} important?", "What are common misconceptions about {topic}?",
    "How has {topic} changed over the last hundred years?", "What are the pros and cons of {topic}?",
    "Write a quiz of five questions about {topic}, with answers.", "Describe {topic} in simple words.",
    "What should a beginner know about {topic}?", "How does {topic} affect everyday life?",
    "Explain the history of {topic} briefly.",
)
WRITING_FORMS = (
    "a short poem", "a haiku", "a limerick", "a short story", "a formal email", "a friendly letter",
    "a product description", "a blog post introduction", "a tweet", "a short speech", "a diary entry",
    "a news headline and a first paragraph", "a dialogue between two friends", "a motivational message",
    "a restaurant review", "an advertisement", "a thank-you note", "a job posting", "a book blurb", "a slogan",
)
WRITING_TONES = ("", " in a cheerful tone", " in a serious tone", " for children", " in exactly three sentences",
                 " in a humorous way", " for a professional audience")
NAMES = ("Anna", "Ben", "Carla", "David", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jack", "Kim", "Leo", "Maya",
         "Noah", "Olga", "Paul", "Rosa", "Sam", "Tara", "Omar")
ITEMS = ("apples", "books", "pencils", "stickers", "cookies", "marbles", "cards", "oranges", "coins", "stamps")


def stdlib_api(root: Path | None = None) -> list[tuple[str, str, str]]:
    """(module, public name, first docstring line) of top-level functions and classes in the stdlib's own
    Python sources, read with `ast` (nothing is imported)."""
    root = root or Path(sys.modules["os"].__file__).parent
    found = []
    for module in sorted(m for m in sys.stdlib_module_names if not m.startswith("_") and m not in SKIP_MODULES):
        path = root / f"{module}.py"
        if not path.is_file():
            path = root / module / "__init__.py"
        if not path.is_file():
            continue
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError):
            continue
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                doc = (ast.get_docstring(node) or "").strip().splitlines()
                found.append((module, node.name, doc[0].strip() if doc else ""))
    return found


def _doc_as_task(doc: str) -> str | None:
    """A docstring's first line as an imperative task ("Return the sum of x" -> "return the sum of x")."""
    if not doc.endswith(".") or ". " in doc:
        return None  # a first line that is not one whole sentence
    doc = doc.rstrip(".").strip()
    words = doc.split()
    if not 4 <= len(words) <= 18 or not words[0][:1].isupper() or any(c in doc for c in "()[]`*=<>"):
        return None
    first = words[0].lower()
    if first.endswith("s") and first not in ("process", "access", "pass"):
        first = first[:-1]  # "Returns" -> "return"
    if first not in ("return", "create", "convert", "compute", "read", "write", "get", "set", "find", "make", "split",
                     "join", "parse", "format", "check", "test", "remove", "add", "copy", "open", "encode", "decode",
                     "build", "generate", "calculate", "change", "wrap", "extract", "compare", "print", "run"):
        return None
    return " ".join([first] + words[1:])


def _reasoning(rng: random.Random) -> str:
    a, b, c = rng.randint(2, 40), rng.randint(2, 30), rng.randint(2, 12)
    n1, n2 = rng.sample(NAMES, 2)
    item = rng.choice(ITEMS)
    kind = rng.randrange(8)
    if kind == 0:
        return f"{n1} has {a} {item} and gives {b % a + 1} to {n2}. How many {item} does {n1} have left? Explain."
    if kind == 1:
        return f"A train travels {a * 10} km in {c} hours. What is its average speed? Show your reasoning."
    if kind == 2:
        return f"If {c} workers build a wall in {a} days, how long would {c * 2} workers take? Explain step by step."
    if kind == 3:
        return f"What is {a} multiplied by {b}, plus {c}? Show your work."
    if kind == 4:
        return f"{n1} is {a} years old. {n2} is {c} years older. How old will {n2} be in {b} years?"
    if kind == 5:
        return f"A shop sells {item} at {c} dollars each. How much do {a} {item} cost with a {b % 50 + 5}% discount?"
    if kind == 6:
        seq = [a + i * c for i in range(5)]
        return f"What is the next number in the sequence {', '.join(map(str, seq))}? Explain the pattern."
    return (f"{n1} is taller than {n2}, and {n2} is taller than {rng.choice(NAMES)}. "
            "Who is the shortest? Explain your answer.")


def build_prompts(count: int, seed: int = 0) -> list[str]:
    """`count` distinct user messages, a mix of stdlib (40%), coding (15%), general (20%), writing (15%)
    and reasoning (10%) prompts, shuffled from `seed`."""
    rng = random.Random(seed)
    api = stdlib_api()
    modules = sorted({m for m, _, _ in api})
    makers = [
        (0.25, lambda: rng.choice(STDLIB_TEMPLATES).format(module=(e := rng.choice(api))[0], name=e[1])),
        (0.08, lambda: rng.choice(MODULE_TEMPLATES).format(module=rng.choice(modules))),
        (0.07, lambda: _doc_prompt(rng, api)),
        (0.15, lambda: rng.choice(CODING_TEMPLATES).format(task=rng.choice(CODING_TASKS))),
        (0.20, lambda: rng.choice(GENERAL_TEMPLATES).format(topic=rng.choice(TOPICS))),
        (0.15, lambda: f"Write {rng.choice(WRITING_FORMS)} about {rng.choice(TOPICS)}{rng.choice(WRITING_TONES)}."),
        (0.10, lambda: _reasoning(rng)),
    ]
    return draw_distinct(rng, makers, count)


def training_prompts(start: int, end: int, seed: int = 0, held_out: set[str] | None = None,
                     source: str = "templates") -> list[str]:
    """`SOURCES[source](end, seed)[start:end]` less the held-out messages (default: the evaluation set's), so that
    a data set keeps the indices of the prompts it answers and no head trains on a prompt it is evaluated on."""
    if held_out is None:
        held_out = set(json.loads(EVAL_PROMPTS.read_text()))
    return [p for p in SOURCES[source](end, seed)[start:end] if p not in held_out]


def _doc_prompt(rng: random.Random, api: list[tuple[str, str, str]]) -> str | None:
    for _ in range(20):
        task = _doc_as_task(rng.choice(api)[2])
        if task:
            return rng.choice(DOC_TEMPLATES).format(doc=task)
    return None


# training_prompts' sources, by name
SOURCES = {"templates": build_prompts, "requests": build_requests, "questions": build_questions}


def iter_chunks(items: list, size: int) -> Iterator[tuple[int, list]]:
    for start in range(0, len(items), size):
        yield start // size, items[start:start + size]
