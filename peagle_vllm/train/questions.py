"""A third source of training prompts: short questions and tasks on subjects the other two sources do not name
(Python how-to, concepts, code reading and small programs; science, history and everyday how-to; advice, writing,
lists of ideas and word problems), phrased yet other ways and weighted near the evaluation set's mix of kinds.

Rule: no word list names a subject of the evaluation set (`peagle_vllm/data/eval_prompts.json`), so a question
built here never paraphrases a held-out message; `tests/unit/test_training_prompts.py` checks the overlap.
"""

from __future__ import annotations

import random

from peagle_vllm.train.draw import draw_distinct

PY_TASKS = (
    "remove the last character of a string", "check if a list is empty", "get the last element of a list",
    "convert a list of numbers to strings", "find the position of a substring", "repeat a string several times",
    "split a list into two halves", "get the keys of a dictionary as a list", "delete a key from a dictionary",
    "invert a dictionary", "sum the values of a dictionary", "check if all items of a list are equal",
    "find the longest string in a list", "remove all spaces from a string", "convert a number to words",
    "check if a number is a perfect square", "compute a square root", "raise a number to a power",
    "convert degrees to radians", "get the absolute value", "truncate a float without rounding",
    "format a number with thousands separators", "parse a date from a string", "get the day of the week for a date",
    "convert a timestamp to a readable date", "measure the age of a person", "read a file into a single string",
    "read only the first ten lines of a file", "copy a file to another folder", "move a file",
    "find files with a given extension", "walk through all subfolders", "get the current folder",
    "change the working directory", "write a dictionary to a JSON file", "read an INI configuration file",
    "exit a script with an error code", "print to standard error", "clear the terminal screen",
    "print text in color in the terminal", "show a progress bar in the terminal",
    "ask the user for a number and validate it", "sleep between loop iterations", "stop a loop after a time limit",
    "run a function after a delay", "get the number of CPU cores", "get the name of the operating system",
    "open a web page in the browser", "parse a URL into its parts", "build a query string for a URL",
    "start a simple web server", "read a file over HTTP", "generate a random string of letters",
    "pick several random items without repeats", "set a random seed", "make a list of dates between two days",
    "count the days until a birthday", "group items of a list by a key", "sort a list of objects by an attribute",
    "sort a list in descending order", "remove None values from a list", "split a text into sentences",
    "wrap long text to a fixed width", "center a string in a given width", "compare two strings ignoring accents",
    "check if a string is a number", "turn a list into a set and back", "find the union of two sets",
    "check if one set is a subset of another", "merge a list of dictionaries", "memoize a slow function",
    "time out a function that runs too long", "catch several exceptions in one block",
    "print the full traceback of an exception", "define a function with optional arguments",
    "return several values from a function", "pass a function as an argument", "store a function in a dictionary",
    "compare two floats safely", "convert Fahrenheit to Kelvin", "check if a number is within a range",
    "generate the alphabet as a list", "convert a character to its code", "encrypt a message with a Caesar cipher",
    "read a password without showing it", "send an email with Python", "zip several files into one archive",
    "extract a tar archive", "calculate a checksum of a file", "plot a simple line chart",
    "compute the median of a list", "compute the standard deviation of numbers", "round a number up",
    "round a number down", "convert a string to a date", "check if a file is empty", "count the characters in a file",
    "read the last line of a file", "remove duplicate lines from a file",
)
PY_TASK_PHRASINGS = (
    "Quick question: how can I {a} in Python?", "What Python code would {a}?", "Help me {a} with Python.",
    "I'm learning Python. How do I {a}?", "Python: {a}. What is the cleanest way?",
    "Could you write a Python snippet to {a}?", "Explain, with code, how to {a} in Python.",
    "What is the Pythonic way to {a}?", "python {a}", "Please show how to {a} using only the standard library.",
    "My code needs to {a}. What should I write in Python?", "Teach me how to {a} in Python.",
)
PY_TOPICS = (
    "variables", "indentation", "comments", "booleans", "integers and floats", "string methods", "escape characters",
    "raw strings", "tuple unpacking", "nested functions", "scope", "the `nonlocal` keyword", "the `global` keyword",
    "exceptions and tracebacks", "the `finally` clause", "the `else` clause of a loop", "iterables",
    "the `any` and `all` functions", "the `isinstance` function", "the `dir` and `help` functions",
    "the `__str__` method", "the `__repr__` method", "the `__eq__` method", "the `__len__` method", "magic methods",
    "class inheritance with `super`", "composition", "encapsulation", "polymorphism", "private attributes", "slots",
    "metaclasses", "descriptors", "modules and imports", "relative imports", "the `sys.path` list", "bytecode",
    "the interpreter", "virtual machines", "the REPL", "the standard library", "third-party packages",
    "requirements files", "unit testing", "assertions", "logging levels", "string encoding", "Unicode",
    "floating-point precision", "big integers", "complex numbers", "the walrus operator", "match statements",
    "type aliases", "generics in type hints", "coroutines", "event loops", "callbacks", "immutability", "hashing",
    "hashable objects", "references", "reference counting",
)
PY_TOPIC_PHRASINGS = (
    "Explain {c} in Python.", "What should a beginner know about {c} in Python?",
    "Give me an example of {c} in Python.", "How does Python handle {c}?", "In a few sentences, explain {c} in Python.",
    "Teach me {c} in Python with a short exercise.", "What is the point of {c} in Python?",
)
SNIPPETS = (
    "print([x * 2 for x in range(5)])", "print('-'.join(['a', 'b', 'c']))", "print(sorted('banana'))",
    "print({k: v for k, v in zip('abc', range(3))})", "print(len(set([1, 2, 2, 3, 3, 3])))",
    "print('hello'.count('l'))", "print(10 // 3, 10 % 3)", "print(list(map(str.upper, ['a', 'b'])))",
    "x = [1, 2, 3]; y = x; y.append(4); print(x)", "print(bool(''), bool('0'), bool([]))",
    "print(max([3, 7, 2], key=lambda n: -n))", "print(' a b '.split())", "print(list(range(10, 0, -3)))",
    "print('abc'.find('z'))", "print([i for i in range(20) if i % 7 == 0])", "print(sum(range(1, 11)))",
    "print(round(2.675, 2))", "print(0.1 + 0.2 == 0.3)", "print('Python'.center(12, '*'))",
    "print(dict.fromkeys(['a', 'b'], 0))", "print(list(enumerate('xy', start=1)))", "print(3 * [0])",
    "print(divmod(17, 5))", "print('{:>6}'.format('hi'))", "print(list(reversed([1, 2, 3])))",
    "print(min('apple', 'pear', key=len))", "print(all([]), any([]))", "print([[0] * 2] * 2)",
    "print('a,b,,c'.split(','))", "print(int('101', 2))", "print(abs(-7.5), pow(2, 5))", "print('x' in 'text')",
    "print(sorted([3, 1, 2], reverse=True))", "print(type(3 / 2), type(3 // 2))",
    "print(list(filter(None, [0, 1, '', 'a'])))",
)
SNIPPET_PHRASINGS = (
    "What does this Python code print, and why?\n\n{s}", "Explain this line of Python step by step:\n\n{s}",
    "I ran this in Python:\n\n{s}\n\nWhat is the output?", "Can you walk me through what this code does?\n\n{s}",
)
PY_PROGRAMS = (
    "tracks daily expenses and prints a summary", "converts a temperature table from Celsius to Fahrenheit",
    "plays hangman in the terminal", "simulates a coin toss a thousand times and counts heads",
    "finds the longest line in a text file", "renames photos by the date in their names", "makes a simple calculator",
    "prints a pyramid of numbers", "checks whether a sentence is a pangram", "keeps a shopping list in a file",
    "converts seconds to hours, minutes and seconds", "draws a diamond of stars",
    "generates a random maze of characters", "tells the user's zodiac sign from a date", "sorts names alphabetically",
    "asks quiz questions from a dictionary", "estimates pi by random sampling", "converts a binary number to decimal",
    "prints the Collatz sequence of a number", "shows the current time every second",
    "splits a bill among friends with a tip", "checks whether three sides form a triangle",
    "finds palindromic words in a list", "simulates a traffic light with timings", "keeps score in a two-player game",
    "merges two text files line by line", "generates a list of random test scores and grades them",
    "makes a to-do list in the terminal", "converts text to Morse code", "checks the strength of a list of passwords",
    "computes loan repayments", "prints a random motivational quote from a list", "counts down to the new year",
    "finds all divisors of a number", "converts a list of grades to letters", "prints a simple bar chart with stars",
    "checks if a word is an isogram", "picks random teams from a list of names",
    "plays tic-tac-toe between two players", "shuffles a deck of cards and deals four hands",
    "plays a text adventure with three rooms", "checks answers to a spelling test", "checks whether a date is valid",
    "simulates a simple dice game",
)
PROGRAM_PHRASINGS = (
    "Write a Python program that {t}.", "I need a Python script that {t}. Can you write it?",
    "Make a small Python project that {t}, and explain how it works.", "Show a simple Python solution that {t}.",
    "Write Python code that {t}. Keep it readable.", "Can you help me write a Python program that {t}?",
    "Write a Python function and a main block that {t}.",
)
PY_THINGS = (
    "a recipe book", "a hotel room booking", "a music album", "a bus route", "a chess piece", "a garden with plants",
    "a smart thermostat", "a weather reading", "a pet at a vet", "a vending machine", "a board game",
    "a flight with passengers", "a school timetable", "a library member", "a fitness tracker", "a pizza order",
    "a clock with alarms", "a robot on a grid", "a train ticket", "a calendar event", "a warehouse shelf",
    "a voting poll", "a video game character", "a delivery truck", "a cinema seat map", "a coffee machine",
    "a sports team", "a museum exhibit", "a bicycle rental", "a dentist appointment", "a gym membership",
    "a quiz with questions", "a plant that needs watering", "an online order", "a car with a fuel tank",
    "a marathon runner", "a concert ticket", "a hospital patient", "a cookbook recipe card",
)
THING_PHRASINGS = (
    "Write a Python class for {o}.", "Model {o} as a Python class with a couple of methods.",
    "Show a Python dataclass that describes {o}, and use it.",
)
SCIENCE = (
    "chlorophyll", "evaporation", "orbits", "conductors and insulators", "static electricity", "sound waves",
    "the speed of light", "neutron stars", "the Big Bang", "the equinox", "ocean currents", "the greenhouse effect",
    "the ozone layer", "sand dunes", "fossils", "extinct animals", "twins", "cells", "white blood cells", "painkillers",
    "the nervous system", "the digestive system", "muscles", "bones", "reflexes", "habits", "eyesight", "hearing",
    "the sense of smell", "allergies", "germs", "atoms", "molecules", "burning and flames", "acids and bases",
    "friction", "inertia", "energy", "heat", "pressure", "buoyancy", "electromagnets", "radioactivity", "nuclear power",
    "wind", "clouds", "snowflakes", "hail", "oases", "mangroves", "kelp forests", "icebergs", "caves", "waterfalls",
    "soil", "food chains", "pollination", "migration of animals", "camouflage in animals", "the life cycle of a frog",
    "dwarf planets", "the moon", "the sun", "space probes", "the International Space Station", "Venus",
    "Saturn's rings", "meteorites", "meteor showers", "time zones", "numbers in ancient Egypt", "bacteria in yogurt",
    "fermentation", "the human skin", "blood types", "sleep cycles", "the speed of sound", "echoes", "mirrors",
    "lenses", "electric circuits", "batteries in phones", "recycling plastic", "earthworms", "jellyfish", "penguins",
    "elephants", "owls", "termites", "lichens", "cactuses", "the Milky Way", "constellations", "observatories",
    "magnifying glasses", "vitamins", "calories", "the lungs", "the kidneys",
)
SCIENCE_PHRASINGS = (
    "Explain {t} in simple words.", "Explain {t} as if I were ten years old.",
    "Give me three interesting facts about {t}.", "How would you explain {t} to a child?",
    "Write a short explanation of {t} for a school report.", "What do scientists know about {t}?",
    "Can you describe {t} in a paragraph?", "Tell me about {t}.", "What is the most surprising thing about {t}?",
    "Explain {t} in three short paragraphs.",
)
HISTORY = (
    "the Roman roads", "the fall of Rome", "the Vikings", "the Silk Road", "the invention of paper", "the Middle Ages",
    "the first factories", "the Russian Revolution", "the American Revolution", "ancient Egypt's pyramids",
    "the Terracotta Army", "the Aztecs", "the Incas", "the Maya", "the Ottoman Empire", "the Cold War",
    "the first satellite in space", "the invention of the telephone", "the invention of the wheel",
    "the first Olympic Games", "the age of exploration", "the Bronze Age", "the Stone Age", "the samurai",
    "the Mongol Empire", "the Black Death", "the ancient Greeks", "the history of writing", "the history of money",
    "the first computers", "the Titanic", "the Wright brothers", "the Hundred Years' War", "the Gold Rush",
    "the steam engine", "the history of the bicycle", "the Hanseatic League", "the Phoenicians", "the history of chess",
    "the Persian Empire",
)
HISTORY_PHRASINGS = (
    "What do you know about {h}?", "Summarize {h} in a few sentences.", "What can we learn from {h} today?",
    "Tell me a short story about {h} for a history class.", "What are the key facts about {h}?",
)
CHORES = (
    "remove a coffee stain from a shirt", "boil an egg", "cook rice on the stove", "change a flat bicycle tire",
    "unclog a sink", "clean a cast-iron pan", "iron a shirt", "sew on a button", "fold a fitted sheet",
    "make a cup of tea properly", "store fresh herbs", "descale a kettle", "keep bread fresh longer",
    "set up a new Wi-Fi router", "back up my phone", "make a strong password", "wrap a present neatly", "tie a tie",
    "hang a picture straight", "paint a small room", "repot a plant", "start a compost bin",
    "clean windows without streaks", "pack a suitcase efficiently", "read a bus timetable", "make pancakes",
    "bake a simple loaf of bread", "cook pasta al dente", "make a budget spreadsheet", "jump-start a car",
    "clean a laptop keyboard", "sharpen a kitchen knife", "remove rust from tools", "make a simple salad dressing",
    "keep a cut flower bouquet fresh", "fix a squeaky door", "clean white sneakers", "organize a fridge",
    "remove chewing gum from clothes", "plant tulip bulbs", "defrost a freezer", "make scrambled eggs",
    "choose a ripe avocado", "patch a hole in a wall", "wash a wool sweater", "charge a phone battery wisely",
    "set up a bird feeder", "cook a baked potato", "sort laundry before washing", "clean a shower head",
)
CHORE_PHRASINGS = (
    "How do I {c}?", "What is the easiest way to {c}?", "Give me step-by-step instructions to {c}.",
    "Can you explain how to {c}?", "I have never tried to {c}. Where do I start?",
)
ADVICE = (
    "drinking more water", "writing my first blog post", "choosing a first programming language",
    "learning to swim as an adult", "starting a vegetable garden", "keeping a clean desk", "planning a trip abroad",
    "saving for a new laptop", "calming down before an exam", "building a reading habit", "starting to meditate",
    "talking to a new team", "teaching a child to ride a bike", "hosting a dinner for friends",
    "moving to a new country", "buying a used car", "looking after an older dog", "learning touch typing",
    "becoming a better listener", "finishing projects I start", "keeping a budget",
    "getting back into exercise after a break", "making a good first impression", "learning to knit",
    "writing a short story", "saying no politely", "keeping a tidy kitchen", "spending less on takeaway food",
    "helping a friend who is sad", "learning to juggle", "remembering names", "preparing for a long flight",
    "working from home",
)
ADVICE_PHRASINGS = (
    "I want help with {g}. What do you suggest?", "What are five tips for {g}?", "How should I approach {g}?",
    "What is a good routine for {g}?", "Any quick advice on {g}?",
)
LISTS = (
    "things to do on a rainy day", "names for a pet turtle", "themes for a school party", "snacks for a long drive",
    "questions to ask at a job interview", "hobbies that cost little", "ways to reuse glass jars",
    "board games for four", "gifts for a friend who loves cooking", "ideas for a science project",
    "ways to save electricity at home", "topics for a short speech", "healthy breakfast ideas",
    "names for a coffee shop", "games for a children's party", "places to visit in a small town",
    "ways to learn new words", "ideas for a weekend with no plans", "exercises to do at a desk",
    "conversation starters for a party",
)
LIST_PHRASINGS = (
    "Give me {n} {l}.", "List {n} {l}.", "Can you suggest {n} {l}?", "I need {n} {l}, with a line on each.",
)
FORMS = (
    "a short poem", "a free-verse poem", "a story for children", "a one-paragraph story", "a diary entry",
    "a thank-you note", "a short blog post", "a motivational message", "a short dialogue", "an advertisement",
    "a news headline and first paragraph", "a short letter to a friend", "a short fairy tale", "a funny rhyme",
    "a bedtime story", "a persuasive paragraph", "a short monologue", "an acrostic poem",
)
THEMES = (
    "a snowy morning", "a ferry captain's dog", "a lost balloon", "a summer market", "a sleepy owl", "a time traveller",
    "a river in spring", "a paper boat", "a dusty attic", "a family picnic", "the first day of school",
    "a city at midnight", "a brave little mouse", "a storm at sea", "a garden party", "a friendly ghost",
    "a street musician", "a new bicycle", "a mountain village", "a kind stranger", "a broken violin",
    "a star that fell", "an old oak tree", "a rainy football game", "a space journey", "a forgotten birthday",
)
FORM_TWISTS = (
    "", " Keep it under 100 words.", " Make it cheerful.", " Make it a little sad.", " Use vivid details.",
    " Write it for young children.", " End with a surprise.",
)


def _word_problem(rng: random.Random) -> str:
    """A grade-school word problem with random numbers, one of twelve kinds."""
    a, b, c = rng.randint(4, 90), rng.randint(2, 30), rng.randint(2, 9)
    kind = rng.randrange(12)
    if kind == 0:
        return f"A book has {a * 10} pages. If I read {b} pages a day, how many days will it take to finish?"
    if kind == 1:
        return f"What is {c}/{c + b} as a decimal and as a percentage?"
    if kind == 2:
        return f"I earn {b} dollars an hour and work {c} hours a day, 5 days a week. What is my weekly pay?"
    if kind == 3:
        return f"There are {a} apples shared among {c} baskets. How many go in each basket, and how many are left?"
    if kind == 4:
        return f"A triangle has angles of {a % 80 + 10} and {b + 20} degrees. What is the third angle?"
    if kind == 5:
        return f"I save {b} dollars a week. How many weeks until I have {a * 10} dollars?"
    if kind == 6:
        return f"Convert {a} kilometres per hour to metres per second. Show the working."
    if kind == 7:
        return f"A box is {c} cm wide, {b} cm long and {c + 3} cm high. What is its volume?"
    if kind == 8:
        return f"A jacket's price rose from {b * 10} to {b * 10 + a} dollars. By what percentage did it rise?"
    if kind == 9:
        return f"A printer prints {b} pages a minute. How long does it take to print {a * 5} pages?"
    if kind == 10:
        return f"Simplify the fraction {a * c}/{b * c} and explain each step."
    return f"A phone costs {a * 10} dollars and loses {c * 5}% of its value each year. What is it worth after 2 years?"


def build_questions(count: int, seed: int = 0) -> list[str]:
    """`count` distinct questions, their kinds drawn from `seed` with weights: Python (41%: how-to, concepts, code
    reading, programs, classes), science and history (21%), everyday how-to and advice (8.5%), lists of ideas (4.5%),
    writing (13%) and word problems (12%), near the evaluation set's mix. The first 3,072 keep every kind within 3
    points of its weight; past them the small kinds' combinations run out and writing and word problems grow."""
    rng = random.Random(seed)
    r = rng.choice
    makers = [
        (0.220, lambda: r(PY_TASK_PHRASINGS).format(a=r(PY_TASKS))),
        (0.080, lambda: r(PY_TOPIC_PHRASINGS).format(c=r(PY_TOPICS))),
        (0.025, lambda: r(SNIPPET_PHRASINGS).format(s=r(SNIPPETS))),
        (0.060, lambda: r(PROGRAM_PHRASINGS).format(t=r(PY_PROGRAMS))),
        (0.025, lambda: r(THING_PHRASINGS).format(o=r(PY_THINGS))),
        (0.170, lambda: r(SCIENCE_PHRASINGS).format(t=r(SCIENCE))),
        (0.040, lambda: r(HISTORY_PHRASINGS).format(h=r(HISTORY))),
        (0.050, lambda: r(CHORE_PHRASINGS).format(c=r(CHORES))),
        (0.035, lambda: r(ADVICE_PHRASINGS).format(g=r(ADVICE))),
        (0.045, lambda: r(LIST_PHRASINGS).format(n=r(("three", "five", "seven", "ten")), l=r(LISTS))),
        (0.130, lambda: f"Write {r(FORMS)} about {r(THEMES)}.{r(FORM_TWISTS)}"),
        (0.120, lambda: _word_problem(rng)),
    ]
    return draw_distinct(rng, makers, count)
