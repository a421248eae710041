"""A second source of training prompts: everyday requests to a chat assistant, phrased many ways (how-to
questions, concepts, comparisons, small programs, questions about the world, advice, writing, summaries, word
problems), each kind from its own phrasings and word lists, deduplicated and shuffled from a seed.

Rule: no word list names a subject of the evaluation set (`peagle_vllm/data/eval_prompts.json`), so a request
built here never paraphrases a held-out message; `tests/unit/test_training_prompts.py` checks the overlap.
"""

from __future__ import annotations

import random

from peagle_vllm.train.draw import draw_distinct

PY_ACTIONS = (
    "remove duplicates from a list", "merge two dictionaries", "reverse a list without changing the original",
    "check if a key exists in a dictionary", "convert a string to a number safely", "split a string on commas",
    "remove whitespace from both ends of a string", "find the index of an item in a list", "copy a list",
    "make a deep copy of a nested dictionary", "write a list of lines to a text file", "append text to a file",
    "check whether a file exists", "list all files in a folder", "delete a file", "create a folder if it is missing",
    "read a CSV file into a list of dictionaries", "write rows to a CSV file", "pretty-print a dictionary",
    "measure how long a piece of code takes", "generate a random integer between 1 and 100",
    "shuffle a list", "pick a random element from a list", "round a number to two decimal places",
    "format a float as a percentage", "pad a number with leading zeros", "convert a list of strings to uppercase",
    "count the items in a list that match a condition", "find the maximum value in a dictionary",
    "combine two lists into a dictionary", "iterate over two lists at the same time", "loop with an index",
    "sort a list of tuples by the second element", "sort strings ignoring case", "flatten a list of lists",
    "remove an item from a list by value", "insert an item at the start of a list", "concatenate strings efficiently",
    "check if a string starts with a given prefix", "replace all occurrences of a word in a string",
    "convert a string to a list of characters", "check if a string contains only digits", "swap two variables",
    "convert a dictionary to a list of pairs", "get unique values from a list",
    "find the intersection of two sets", "compute the difference between two dates", "add days to a date",
    "wait for a few seconds", "read environment variables",
    "get the size of a file", "compress a file into a zip archive", "download a web page with the standard library",
    "send an HTTP GET request", "hash a password", "generate a unique identifier", "encode text as base64",
    "validate that a string is a valid URL", "extract all numbers from a string", "find all email addresses in a text",
    "convert a string to title case", "remove punctuation from a string", "count the words in a file",
    "write unit tests for a small function",
    "log messages to a file", "handle division by zero", "raise a custom exception", "retry an operation that fails",
    "run two functions in parallel", "schedule a function to run every minute", "store data in a SQLite database",
    "serialize an object to a file", "convert a list to a string with separators", "print a table of values",
    "read user input until they type quit", "build a simple menu in the terminal", "check the Python version",
    "install a package with pip", "use type hints in a function", "find duplicates in a list",
    "check if two lists have the same elements",
    "compute the sum of a list of numbers", "find the smallest number in a list without min",
    "turn a nested loop into a list comprehension", "remove empty strings from a list", "chain several functions",
    "convert bytes to a string", "get the file extension from a path", "rename many files at once",
)
PY_ACTION_PHRASINGS = (
    "How do I {a} in Python?", "What's the best way to {a} in Python?", "Can you show me how to {a} in Python?",
    "I need to {a}. How can I do that in Python?", "Write a short Python script to {a}.",
    "Give me Python code to {a}, and explain it.", "In Python, what is the simplest way to {a}?",
    "Show two different ways to {a} in Python.", "Is there a built-in way to {a} in Python?",
    "Explain how to {a} in Python, step by step.", "how to {a} python", "Python question: how would you {a}?",
)
PY_CONCEPTS = (
    "a list comprehension", "a dictionary", "a set", "a lambda function", "a closure", "a class", "inheritance",
    "a method", "a module", "a package", "an exception", "a try/except block", "an iterator", "recursion",
    "a dataclass", "an enum", "a named tuple", "a global variable", "the `self` parameter",
    "the `__init__` method", "an f-string", "string formatting", "type hints", "duck typing", "a property",
    "a static method", "a class method", "multiple assignment", "unpacking", "the `return` statement",
    "the `break` and `continue` statements", "a while loop", "a for loop", "the `range` function",
    "the `enumerate` function", "the `zip` function", "the `map` function", "the `filter` function",
    "the `sorted` function", "mutability", "a shallow copy", "garbage collection", "the GIL", "async and await",
    "a thread", "a process", "a regular expression", "a docstring", "PEP 8", "the `__name__ == '__main__'` check",
    "an abstract base class", "operator overloading", "a frozenset", "a byte string", "integer division",
    "the `None` value", "boolean short-circuiting", "a default argument", "keyword-only arguments",
)
PY_CONCEPT_PHRASINGS = (
    "What is {c} in Python?", "Explain {c} in Python with a short example.", "When should I use {c} in Python?",
    "Can you explain {c} in Python to a beginner?", "Show me a simple example of {c} in Python.",
    "What are common mistakes with {c} in Python?", "Why would a Python programmer use {c}?",
    "I don't understand {c} in Python. Can you help?",
)
PY_PAIRS = (
    ("a list", "a set"), ("a dictionary", "a list of pairs"), ("`append`", "`extend`"), ("`sort`", "`sorted`"),
    ("`remove`", "`pop`"), ("a function", "a method"), ("a module", "a package"), ("`range`", "a list"),
    ("`str`", "`repr`"), ("a shallow copy", "a deep copy"), ("a thread", "a process"),
    ("a class attribute", "an instance attribute"), ("`break`", "`return`"), ("`for`", "`while`"),
    ("a tuple", "a named tuple"), ("`import x`", "`from x import y`"), ("Python 2", "Python 3"),
    ("a static method", "a class method"),
    ("an iterator", "an iterable"), ("`del`", "`None` assignment"), ("`try/except`", "`if` checks"),
    ("`pip`", "`conda`"), ("`assert`", "raising an exception"), ("`/`", "`//`"),
)
COMPARE_PHRASINGS = (
    "What is the difference between {x} and {y} in Python?", "When should I use {x} instead of {y} in Python?",
    "Compare {x} and {y} in Python with examples.", "{x} or {y} in Python: which one should I choose, and why?",
)
PY_OBJECTS = (
    "a library book that can be borrowed and returned", "a shopping cart with items and a total price",
    "a to-do list with tasks that can be marked done", "a rectangle with methods for area and perimeter",
    "a student with grades and an average", "a simple counter that can be reset", "a playing card and a deck",
    "a temperature that converts between Celsius and Fahrenheit", "a stopwatch", "a contact book",
    "a queue at a ticket office", "a parking lot with a limited number of spaces", "a simple inventory of a shop",
    "a 2D point with a distance method", "a movie with a title, year and rating", "an employee with a salary raise",
    "a dice that can be rolled", "a playlist of songs", "a recipe with ingredients", "a traffic light",
)
PROGRAM_TASKS = (
    "prints the first 20 square numbers", "converts kilometres to miles for a list of distances",
    "plays rock, paper, scissors against the computer", "guesses a number the user is thinking of",
    "prints a countdown from 10 to 1", "draws a triangle of stars in the terminal",
    "finds the largest file in a folder", "simulates rolling two dice 1000 times",
    "prints the calendar of the current month",
    "checks whether a password is strong", "converts a sentence to pig latin", "prints the FizzBuzz sequence",
    "computes compound interest", "computes a tip for a restaurant bill", "tells whether a number is even or odd",
    "prints all prime numbers below 100", "converts a decimal number to hexadecimal", "makes a simple quiz game",
    "computes the body mass index", "reverses the words in a sentence", "keeps a running high score in a file",
)
PROGRAM_PHRASINGS = (
    "Write a Python program that {t}.", "Can you write a small Python script that {t}?",
    "Write a beginner-friendly Python program that {t}, with comments.", "Create a Python function that {t}.",
)
CLASS_PHRASINGS = (
    "Write a Python class that represents {o}.", "Design a small Python class for {o}, with an example of its use.",
    "How would you model {o} with a Python class?",
)
DEVICES = (
    "a microwave oven", "a compass", "a thermometer", "a battery", "a light bulb", "a solar panel", "a wind turbine",
    "a touchscreen", "a camera", "a speaker", "a microphone", "an elevator", "a bicycle gear", "a lock and key",
    "a washing machine", "a vacuum cleaner", "a smoke detector", "a barcode scanner", "a credit card chip",
    "a hot air balloon", "a submarine", "a rocket", "a clock", "a piano", "an electric motor", "Wi-Fi",
    "a search engine", "email", "a vaccine", "an X-ray machine", "a hearing aid", "a dishwasher", "a sailboat",
)
DEVICE_PHRASINGS = ("How does {d} work?", "Explain how {d} works in simple terms.", "What is inside {d}?",
                    "Who invented {d}, and how has it changed?")
WHY_QUESTIONS = (
    "Why do cats purr?", "Why do leaves have different shapes?", "Why is the ocean salty?", "Why do we dream?",
    "Why do onions make people cry?", "Why does bread rise?", "Why do stars twinkle?", "Why do we yawn?",
    "Why is the Dead Sea called dead?", "Why do birds fly south in winter?", "Why do metals feel cold?",
    "Why do we get goosebumps?", "Why do some animals hibernate?", "Why does the moon change shape?",
    "Why do we have fingerprints?", "Why do volcanoes erupt?", "Why is gold valuable?", "Why do we need sleep?",
    "Why do our ears pop on a mountain road?", "Why is the grass green?", "Why do zebras have stripes?",
    "Why does soap remove dirt?", "Why do deserts get cold at night?", "Why do people speak different languages?",
    "What causes earthquakes?", "What causes the northern lights?", "What causes hiccups?", "What causes rust?",
    "What causes fog?", "What causes a rainbow to form?", "What causes tides?", "What causes a fever?",
    "How do fish breathe under water?", "How do vaccines train the immune system?", "How do bats find their way?",
    "How do spiders make webs?", "How are mountains formed?", "How does recycling paper work?",
    "How do whales communicate?", "How do magnets work?", "How does the heart pump blood?",
    "How do chameleons change color?", "How is glass made?", "How did ancient sailors navigate?",
    "How is chocolate made?", "How do tsunamis form?",
)
PEOPLE = (
    "Marie Curie", "Isaac Newton", "Ada Lovelace", "Leonardo da Vinci", "Nelson Mandela", "Albert Einstein",
    "Cleopatra", "Galileo Galilei", "Mahatma Gandhi", "Charles Darwin", "Frida Kahlo", "Alan Turing",
    "Wolfgang Amadeus Mozart", "Florence Nightingale", "Genghis Khan", "Nikola Tesla", "Jane Austen",
    "Rosalind Franklin", "Confucius", "Queen Victoria", "Louis Pasteur", "Amelia Earhart", "Vincent van Gogh",
)
PERSON_PHRASINGS = ("Who was {p}, and why is this person remembered?", "Tell me three facts about {p}.",
                    "What did {p} contribute to the world?", "Give a short biography of {p}.")
PLACES = (
    "Iceland", "the Amazon river", "Japan", "Kenya", "Peru", "the Sahara", "Venice", "Antarctica", "Canada",
    "New Zealand", "the Grand Canyon", "Mongolia", "Greece", "Madagascar", "the Himalayas", "Norway", "Morocco",
    "Brazil", "Egypt", "the Galapagos Islands", "Scotland", "Vietnam", "Chile", "the Alps",
)
PLACE_PHRASINGS = ("What is {p} known for?", "Describe the climate and landscape of {p}.",
                   "What should a visitor know before going to {p}?", "Tell me about the history of {p} in brief.")
WORLD_PAIRS = (
    ("a virus", "a bacterium"), ("a comet", "an asteroid"), ("a crocodile", "an alligator"), ("a lake", "a pond"),
    ("a hurricane", "a tornado"), ("a city", "a town"), ("a fruit", "a vegetable"), ("an ape", "a monkey"),
    ("a star", "a planet"), ("a butterfly", "a moth"), ("a rabbit", "a hare"), ("speed", "velocity"),
    ("a democracy", "a monarchy"), ("an ocean", "a sea"), ("baking soda", "baking powder"), ("a cold", "the flu"),
    ("mass", "weight"), ("a dolphin", "a shark"), ("a violin", "a viola"), ("a solar eclipse", "a lunar eclipse"),
)
ADVICE_GOALS = (
    "sleeping better", "learning to cook", "saving money for a holiday", "making new friends in a new city",
    "writing a good CV", "preparing for a job interview", "learning to play the guitar", "keeping a journal",
    "running my first 5 km", "reducing screen time", "learning a new language as an adult", "keeping houseplants alive",
    "organizing a small apartment", "giving a presentation without nerves", "reading more books",
    "eating more vegetables", "managing a busy week", "starting to draw", "training a puppy",
    "keeping a long-distance friendship", "planning a birthday party", "decluttering a wardrobe",
    "learning to code", "staying motivated at the gym", "taking better photos with a phone", "negotiating a salary",
    "writing clearer emails", "dealing with a difficult coworker", "planning a road trip", "cooking on a budget",
)
ADVICE_PHRASINGS = ("Give me some tips for {g}.", "What are the first steps in {g}?", "I struggle with {g}. Any advice?",
                    "What helps most with {g}?", "Make a one-week plan for {g}.",
                    "What mistakes do people make when {g}?")
WRITING_KINDS = (
    "a short poem", "a haiku", "a limerick", "a sonnet", "a short story", "a fable with a moral",
    "a fairy tale opening",
    "a formal letter", "a cover letter", "a text message", "a toast", "a eulogy", "a short speech", "a riddle",
    "a joke", "a song chorus", "a postcard", "a recipe introduction", "a travel guide paragraph", "a LinkedIn post",
    "an apology note", "an invitation", "a complaint letter", "a review", "a slogan", "a product description",
    "a scene of dialogue", "a newsletter introduction", "a short essay", "a letter to my future self",
)
WRITING_SUBJECTS = (
    "a rainy afternoon in the city", "a lost umbrella", "the first snow of winter", "a friendly dragon",
    "a broken clock", "a forgotten garden", "a busy train station", "a kite that flew away",
    "a grandfather's old watch", "a new neighbour", "a bakery at dawn", "the last day of summer",
    "a cat who guards a library", "a trip to the mountains", "a school science fair",
    "a lost letter", "a quiet village", "a football match in the rain", "a home-made kite", "a coffee shop",
    "a mountain bike", "a noisy parrot", "an old map", "a hot-air balloon ride", "a first day at a new job",
)
WRITING_OCCASIONS = (
    "a colleague's retirement", "a friend's wedding", "a team that won a tournament", "a new baby in the family",
    "a neighbour who helped me move", "the opening of a small bookshop", "a teacher at the end of the year",
    "a cancelled order", "a late delivery", "a volunteer day at the park", "a club's tenth anniversary",
    "a graduation", "a housewarming party", "a charity run", "the launch of a mobile app",
)
WRITING_TWISTS = ("", " Keep it short.", " Make it funny.", " Use simple words.", " Make it rhyme.",
                  " Use no more than 60 words.", " Make it warm and personal.", " Write it for teenagers.")
WORKS = (
    "Hamlet", "Macbeth", "Pride and Prejudice", "The Odyssey", "Moby-Dick", "Frankenstein", "Don Quixote",
    "The Little Prince", "Alice's Adventures in Wonderland", "Treasure Island", "A Christmas Carol",
    "The Hobbit", "Little Women", "Robinson Crusoe", "Gulliver's Travels", "The Wizard of Oz", "Jane Eyre",
    "Around the World in Eighty Days", "The Jungle Book", "Oliver Twist", "The Time Machine", "Peter Pan",
)
WORK_PHRASINGS = ("Summarize {w} in five sentences.", "Who are the main characters in {w}?",
                  "What is the main theme of {w}?", "Why is {w} still read today?",
                  "Explain the ending of {w} to someone who has not read it.")


def _word_problem(rng: random.Random) -> str:
    """A grade-school word problem with random numbers, one of twelve kinds."""
    a, b, c = rng.randint(3, 60), rng.randint(2, 25), rng.randint(2, 9)
    kind = rng.randrange(12)
    if kind == 0:
        return f"A bus has {a} passengers. At the next stop {b % a + 1} get off and {c} get on. How many are on the bus?"
    if kind == 1:
        return f"A circle has a radius of {c} cm. What is its area? Use 3.14 for pi and show the steps."
    if kind == 2:
        return f"A recipe needs {c} eggs for {b} cookies. How many eggs are needed for {b * 3} cookies?"
    if kind == 3:
        return f"A runner covers {c}.{b % 10} km in {a} minutes. What is the pace per kilometre?"
    if kind == 4:
        return f"A town of {a * 1000} people grows by {c}% a year. How many people live there after two years?"
    if kind == 5:
        return f"A shirt costs {a} dollars and is on sale for {b % 40 + 10}% off. What is the sale price?"
    if kind == 6:
        return f"Convert {a * 100} minutes into hours and minutes. Explain."
    if kind == 7:
        return f"A square garden has a side of {c} metres. How much fence is needed to go around it?"
    if kind == 8:
        return f"A tank holds {a * 10} litres and drains {b} litres per minute. How long until it is empty?"
    if kind == 9:
        return f"Solve for x: {c}x + {b} = {c * a + b}. Show each step."
    if kind == 10:
        return f"A class has {a + 10} students and {c} teams of equal size, with the rest as helpers. How big is a team?"
    return f"What is the average of {a}, {b}, {c} and {a + b}? Explain how the average is computed."


def build_requests(count: int, seed: int = 0) -> list[str]:
    """`count` distinct requests, their kinds drawn from `seed` with weights: Python (45%: how-to, concepts,
    comparisons, programs, classes), the world (25%), advice (10%), writing (12%), books (3%) and word problems (5%).
    A kind whose combinations run out adds nothing more, so long lists lean to the larger kinds (writing)."""
    rng = random.Random(seed)
    r = rng.choice
    makers = [
        (0.20, lambda: r(PY_ACTION_PHRASINGS).format(a=r(PY_ACTIONS))),
        (0.08, lambda: r(PY_CONCEPT_PHRASINGS).format(c=r(PY_CONCEPTS))),
        (0.04, lambda: r(COMPARE_PHRASINGS).format(x=(p := r(PY_PAIRS))[0], y=p[1])),
        (0.08, lambda: r(PROGRAM_PHRASINGS).format(t=r(PROGRAM_TASKS))),
        (0.05, lambda: r(CLASS_PHRASINGS).format(o=r(PY_OBJECTS))),
        (0.07, lambda: r(DEVICE_PHRASINGS).format(d=r(DEVICES))),
        (0.07, lambda: r(WHY_QUESTIONS)),
        (0.04, lambda: r(PERSON_PHRASINGS).format(p=r(PEOPLE))),
        (0.04, lambda: r(PLACE_PHRASINGS).format(p=r(PLACES))),
        (0.03, lambda: "What is the difference between {} and {}?".format(*r(WORLD_PAIRS))),
        (0.10, lambda: r(ADVICE_PHRASINGS).format(g=r(ADVICE_GOALS))),
        (0.08, lambda: f"Write {r(WRITING_KINDS)} about {r(WRITING_SUBJECTS)}.{r(WRITING_TWISTS)}"),
        (0.04, lambda: f"Write {r(WRITING_KINDS)} for {r(WRITING_OCCASIONS)}.{r(WRITING_TWISTS)}"),
        (0.03, lambda: r(WORK_PHRASINGS).format(w=r(WORKS))),
        (0.05, lambda: _word_problem(rng)),
    ]
    return draw_distinct(rng, makers, count)
