"""Programming prompts for MTP-head training, a wider space than the `code-tasks` set.

`code-tasks` (kernels/mtp_prompts.py) composes 20 verbs with 18 objects under four templates: 1,480
prompts in all, every one of them answered by the shipped head's data. Users ask a code assistant
for more than that: functions over numbers, text, dates and collections with a constraint
("recursively", "with type hints"), scripts that read and write files, classes for everyday things,
Python concepts and errors explained, and the neighbouring languages (JavaScript, SQL, shell). This
set composes such requests from templates and slot lists written for this project. The held-out
benchmark prompts stay out by the chat set's rules: no prompt equal to, inside or containing one,
and none sharing most of one's content words once the words every code request has are set aside.
"""

from __future__ import annotations

import random

from kernels.mtp_chat_prompts import _COMMON, _fill, capacity, content_words, near
from kernels.mtp_prompts import Prompt, _distinct, held_out_prompts

PROGRAM_TEMPLATES = {
    "function": "Write a Python function that {task}.",
    "function-constraint": "Write a Python function that {task}, {constraint}.",
    "function-calls": "Write a Python function that {task}, and show two example calls.",
    "function-tests": "Write a Python function that {task}, with pytest tests for it.",
    "steps": "How would I write Python code that {task}? Explain each step.",
    "script": "Write a Python script that {script}.",
    "class": "Write a Python class for {entity}.",
    "concept": "Explain {concept} in Python with a short example.",
    "compare": "What is the difference between {pair} in Python?",
    "error": "What does the Python error `{error}` usually mean, and how do I fix it?",
    "how-to": "How do I {idiom} in Python?",
    "algorithm": "Implement {algorithm} in Python and explain how it works.",
    "complexity": "What is the time complexity of {algorithm}, and why?",
    "javascript": "Write a JavaScript function that {task}.",
    "sql": "Write a SQL query that {sql}.",
    "shell": "Write a bash script that {shell}.",
}

_SLOTS = {
    "task": """returns the median of a list of numbers|returns the mode of a list of numbers|computes the
standard deviation of a list of floats|returns the running total of a list of numbers|checks whether a
number is a perfect square|returns the digits of an integer as a list|sums the digits of a positive
integer|checks whether a number is an Armstrong number|returns the n-th triangular number|converts
minutes into hours and minutes|converts a number of seconds into a readable duration|rounds a price to
the nearest five cents|computes compound interest over a number of years|returns the distance between
two points|checks whether three lengths can form a triangle|computes the area of a circle from its
radius|returns the least common multiple of two numbers|checks whether a list is sorted|returns the
index of the first negative number in a list|moves all zeros in a list to the end|rotates a list by k
positions|returns the elements two lists have in common|returns the difference between two lists|
interleaves two lists|pairs up the items of two lists into a dictionary|inverts a dictionary|merges two
dictionaries, adding values of shared keys|returns the key with the highest value in a dictionary|
groups a list of words by their first letter|groups a list of numbers into odd and even|counts the words
in a paragraph|returns the shortest word in a sentence|converts a sentence to title case|converts
snake_case to camelCase|converts camelCase to snake_case|removes punctuation from a string|checks
whether a string contains only digits|masks all but the last four digits of a card number|truncates a
string to a maximum length with an ellipsis|pads a number with leading zeros|wraps a long line of text
at a given width|counts the uppercase letters in a string|
checks whether a password is strong enough|generates a random password|generates a random hex colour|
parses a date string like 2024-03-15 into a date object|returns the number of days between two dates|
returns the weekday of a given date|checks whether a date falls on a weekend|returns the age of a person
from their birth date|reads a JSON file and returns the data|writes a list of dictionaries to a CSV
file|returns the size of a file in a readable unit|lists the files in a folder with a given extension|
finds the longest line in a text file|finds the pair of numbers in a list that adds up to a target|
returns every subset of a small set|returns every permutation of a short string|
checks whether brackets in a string are balanced|evaluates a simple
arithmetic expression given as a string|counts the set bits of an integer|returns the n-th row of Pascal's
triangle|builds a multiplication table as a list of lists|returns the sum of the diagonal of a square
matrix|finds the peak element of a list|merges overlapping intervals|returns the top three scores from a
list|splits a full name into first and last name|formats a number with thousands separators|checks
whether a list contains duplicates|returns the cumulative product of a list|compresses repeated
characters of a string|removes empty strings from a list|retries a function call up to three times|
caches the results of an expensive function|returns the first n square numbers|flips the case of every
letter in a string|checks whether two lists have the same items in any order|returns the frequency of
each word in a list as a dictionary""",
    "constraint": """using recursion|using a list comprehension|without any imports|with type hints|
with a docstring|handling an empty input|raising a ValueError on bad input|in a single line|using only a
for loop|using the collections module|using itertools|in an efficient way for large inputs""",
    "script": """renames every file in a folder to lower case|prints the ten largest files under a
directory|copies every .jpg file from one folder to another|asks the user for a number and prints
whether it is odd or even|plays a number-guessing game in the terminal|reads a CSV of expenses and
prints the total per category|counts the words in every line of a text file|
keeps a simple to-do list in a JSON file|prints a
countdown from ten to zero, one second apart|converts a CSV file to JSON|prints today's date in three
formats|finds duplicate files in a folder by their contents|splits a large text file into smaller
files|prints a calendar for the current month|reads numbers from the user until they type done and
prints the average|merges several text files into one|prints the lines of a log file that contain
ERROR|rolls two dice a thousand times and prints how often each total came up|simulates a simple
vending machine in the terminal|backs up a folder into a zip archive with the date in its name|reads a
list of names from a file and prints them sorted|prints a simple ASCII bar chart of word lengths|
checks a list of passwords against simple rules and reports the weak ones""",
    "entity": """a library book that can be borrowed and returned|a car with a fuel level and a mileage|
a recipe with ingredients and steps|a music album with its tracks|a hotel room booking|a parking lot
with a fixed number of spaces|a simple bank of lockers|a thermostat with a target temperature|a
movie ticket order|a contact book|a fraction that supports addition and comparison|a 3D vector with
addition and dot product|a time of day that can be advanced by minutes|a traffic light that cycles
through its colours|a board for tic-tac-toe|a queue of customers at a shop|a simple cache with a size
limit|a polynomial that can be evaluated|a shopping list that groups items by aisle|an employee with a
salary and a raise method|a quiz with questions and a score|a garden with plants and watering dates|a
circle and a square that share a shape base class|a bus route with stops|a rating system for
restaurants|a word counter for a document""",
    "concept": """list comprehensions|generators|the with statement|decorators|*args and **kwargs|
lambda functions|dictionary comprehensions|exceptions and try/except|f-strings|the enumerate
function|the zip function|slicing|classes and objects|inheritance|dataclasses|type hints|modules and
imports|virtual environments|the __init__ method|properties|iterators|context managers|sets|tuples
and unpacking|default arguments|recursion|closures|the map and filter functions|string methods|the
main guard if __name__ == '__main__'|mutable and immutable types|shallow and deep copies""",
    "pair": """a list and a tuple|is and ==|append and extend|a method and a function|a module and a
package|break and continue|return and yield|a class variable and an instance variable|sort() and
sorted()|a set and a frozenset|del and remove|str() and repr()|an iterator and an iterable|
a shallow copy and a deep copy|staticmethod and classmethod|import module and from module import name|
a dictionary and a list of pairs|range and a list|global and local variables|an exception and an
error message""",
    "error": """IndexError: list index out of range|KeyError|TypeError: 'NoneType' object is not
subscriptable|NameError: name is not defined|IndentationError: unexpected indent|ValueError: invalid
literal for int() with base 10|AttributeError: 'str' object has no attribute|ZeroDivisionError:
division by zero|ModuleNotFoundError: No module named|TypeError: can only concatenate str (not "int") to
str|RecursionError: maximum recursion depth exceeded|FileNotFoundError: No such file or directory|
UnboundLocalError: local variable referenced before assignment|SyntaxError: invalid syntax|TypeError:
unhashable type: 'list'|StopIteration""",
    "idiom": """read a file line by line|write text to a file|loop over a dictionary's keys and values|
sort a list in reverse order|get the current date and time|measure how long some code takes|parse
command-line arguments|make an HTTP request with the standard library|convert a string to a number
safely|check whether a file exists|create a folder if it does not exist|join a list of strings with
commas|find the index of an item in a list|copy a list|remove an item from a dictionary|format a float
with two decimals|generate a random integer in a range|read environment variables|run another program
and read its output|log messages to a file|work with paths in a portable way|swap two variables|
check the type of a variable|iterate over two lists at once""",
    "algorithm": """linear search|binary search on a sorted list of words|a hash table with chaining|
topological sort|union-find|the Knapsack problem with dynamic programming|the longest increasing
subsequence|the edit distance between two strings|Floyd's cycle detection|a trie for word lookup|
the Tower of Hanoi|Prim's algorithm|Kruskal's algorithm|A* search on a grid|quickselect|
the Boyer-Moore majority vote|reservoir sampling|the Fisher-Yates shuffle|Horner's method|
fast exponentiation by squaring|the flood fill algorithm|a min-heap from scratch|Bellman-Ford|
the coin change problem|binary search for a square root""",
    "sql": """lists the employees who earn more than their department's average|counts the orders
placed in each month of last year|finds the products that have never been ordered|returns the three
most recent posts of each user|deletes duplicate rows from a table of emails|shows each city with its
number of customers, largest first|finds students enrolled in more than two courses|joins orders with
customers and shows the customer name for each order|computes the average rating of every book with at
least ten reviews|lists the categories whose total sales exceeded 10,000|updates the price of every
item in a category by ten percent|finds the second highest salary|returns the users who signed up but
never logged in|creates a table for blog posts with a primary key and timestamps""",
    "shell": """renames every .jpeg file in a folder to .jpg|prints the five largest files in the
current directory|backs up a folder into a dated tar archive|checks whether a website's log has any
lines with 404|deletes files older than seven days in a folder|prints the disk usage of every
subfolder|loops over the arguments it is given and prints each one|counts how many times each word
appears in a file|checks whether a command is installed before running it|prints a greeting that
depends on the time of day|creates a folder for each name listed in a file|compresses every log file
in a folder|waits until a file appears and then prints its contents|prints the ten most recently
changed files""",
}
PROGRAM_SLOTS = {name: [" ".join(item.split()) for item in text.split("|")] for name, text in _SLOTS.items()}
# Words nearly every code request has: left out before comparing with a held-out prompt, so that
# "Write a Python function" alone never counts as a paraphrase, and the task's own words do.
_CODE_COMMON = _COMMON | set("write python function program script class implement explain works "
                             "javascript sql query bash given".split())


def program_prompts(count: int, seed: int) -> list[Prompt]:
    """`count` distinct programming prompts, slots drawn with the seed; none equal to, inside,
    containing or a near-paraphrase of a held-out prompt. Templates are drawn in proportion to how
    many prompts each can make, up to 400."""
    rng = random.Random(seed)
    names = sorted(PROGRAM_TEMPLATES)
    weights = [min(capacity(PROGRAM_TEMPLATES[n], PROGRAM_SLOTS), 400) for n in names]
    held_out = [code_words(h) for h in held_out_prompts()]

    def draw(_: int) -> Prompt:
        name = rng.choices(names, weights)[0]
        text = _fill(PROGRAM_TEMPLATES[name], rng, PROGRAM_SLOTS)
        while any(near(code_words(text), h) for h in held_out):
            text = _fill(PROGRAM_TEMPLATES[name], rng, PROGRAM_SLOTS)  # too close to a benchmark prompt
        return Prompt("program", name, text)

    return _distinct(count, rng, draw)


def code_words(text: str) -> set[str]:
    return content_words(text, _CODE_COMMON)
