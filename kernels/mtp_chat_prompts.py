"""Conversational prompts for MTP-head training: the questions people put to a chat assistant.

The `everyday` set (kernels/mtp_prompts.py) has twelve templates around one topic word, so its
answers share a few shapes (stories, letters, facts). Users ask in many more: how things work, why
things happen, plans, recipes, advice on a situation of their own, short messages, summaries. This
set composes such questions from templates and slot lists written for this project. The held-out
benchmark prompts (tests/prompts/) stay out: besides the shared equal / inside rule, a prompt whose
content words are mostly a held-out prompt's is dropped, so no paraphrase of one is trained on.
"""

from __future__ import annotations

import math
import random
import re

from kernels.mtp_prompts import Prompt, _distinct, held_out_prompts

CHAT_TEMPLATES = {
    "how-works": "How does {mechanism} work?",
    "how-works-simple": "Can you explain in simple terms how {mechanism} works?",
    "why": "Why do {why}?",
    "why-kid": "My child asked me why we {why_we}. How should I explain it?",
    "concept": "Describe {concept} in a short paragraph.",
    "concept-audience": "How would you explain {concept} to {audience}?",
    "difference": "What is the difference between {pair}?",
    "learn": "What is a good way to begin learning {skill}?",
    "learn-mistakes": "What mistakes do beginners often make when learning {skill}?",
    "tips": "Give me a few practical tips for {activity}.",
    "keep-in-mind": "What should I keep in mind when {activity}?",
    "situation": "I {situation}. Do you have any suggestions?",
    "situation-help": "I {situation}. What would you do in my place?",
    "goal": "What can I do to {goal}?",
    "improve": "How can I improve my {aspect}?",
    "benefits": "What are the benefits of {habit}?",
    "trip": "I am visiting {place} for {days} days. What should I see and do?",
    "trip-know": "What should I know before travelling to {place} for the first time?",
    "plan": "Make me a simple {plan}.",
    "cook-with": "What could I make for {meal} using {ingredient}, {ingredient2} and {ingredient3}?",
    "cook-dish": "How do I make {dish} at home?",
    "poem": "Write a {form} about {scene}.",
    "story": "Tell me a short story about {character} who {event}.",
    "message": "Write a {tone} {note} to {recipient}.",
    "history": "What were the main effects of {event_past}?",
    "history-why": "Why was {event_past} important?",
    "ideas": "Give me {count} ideas for {occasion}.",
    "name": "Suggest a name for {business}.",
    "summary": "Give a short summary of {story_title}.",
    "recommend": "Can you recommend {recommend}?",
    "pros-cons": "What are the pros and cons of {choice}?",
    "list": "List {count} things everyone should know about {topic}.",
}

_SLOTS = {
    "mechanism": """a refrigerator|a bicycle's gears|a microwave oven|a compass|a solar panel|an elevator|
a thermostat|a hot-air balloon|a lock and key|a camera lens|a battery|a washing machine|a heat pump|
a submarine|a parachute|satellite navigation|a vending machine|a wind turbine|a hearing aid|
a traffic light|a dishwasher|a pressure cooker|an electric kettle|a smoke detector|a zip|a piano|
a telescope|a credit card payment|a water filter|a bread machine|an airplane wing|a sailboat""",
    "why": """birds migrate in autumn|leaves change colour in autumn|onions make people cry|stars twinkle|
people get hiccups|bees make honey|some animals hibernate|people snore|dogs wag their tails|ships float|
people sneeze|owls hunt at night|our ears pop on airplanes|bubbles form in boiling water|
some trees lose their leaves in winter|people dream|fireflies glow|cuts itch as they heal|
apples turn brown after being cut|mosquitoes bite some people more than others|zebras have stripes|
cakes rise in the oven|old books smell the way they do|we get goosebumps""",
    "why_we": """need to sleep|have fingerprints|get tired after lunch|blink|feel dizzy after spinning|
have to brush our teeth|see lightning before we hear thunder|have different blood types|
get wrinkly fingers in the bath|laugh""",
    "concept": """compound interest|gravity|a food chain|erosion|democracy|supply and demand|the immune system|
evaporation|electricity|friction|the greenhouse effect|digestion|a credit score|renewable energy|
the metric system|an ecosystem|magnetism|the solar system|time zones|interest rates|a mortgage|
pollination|fermentation|an election|recycling|the stock market|a balanced diet|the internet|
a heartbeat|an earthquake|a tax return|a leap year|metamorphosis|sound waves|a pension""",
    "audience": """a ten-year-old|my grandmother|someone new to the subject|a friend from another country|
a group of young children|someone who has never studied science""",
    "pair": """a lake and a pond|a frog and a toad|baking soda and baking powder|a crocodile and an alligator|
a hurricane and a tornado|a credit card and a debit card|a fruit and a vegetable|an ocean and a sea|
a democracy and a monarchy|a simile and a metaphor|a moth and a butterfly|a comet and an asteroid|
speed and velocity|a muffin and a cupcake|a rabbit and a hare|a city and a town|a cold and the flu|
a poem and a song|a dolphin and a porpoise|jam and jelly|a turtle and a tortoise|a cafe and a restaurant""",
    "skill": """to swim|to knit|to draw|to cook|a new language|to juggle|photography|to bake bread|chess|
to paint with watercolours|to dance|to run long distances|to sing|to ride a bike|yoga|the piano|
woodworking|gardening|to touch type|calligraphy|to sew|to play tennis|to ski|the violin|pottery""",
    "activity": """keeping a tidy room|speaking in public|making friends in a new city|taking care of houseplants|
staying healthy in winter|planning a small wedding|learning new words|driving in the rain|working from home|
training a puppy|packing a suitcase|cooking for a large family|waking up early|reading more books|
keeping a journal|saving energy at home|writing a cover letter|running a first race|moving to a new house|
hosting a dinner party|taking better photos with a phone|travelling with young children|buying a used car|
starting a vegetable garden|organising a wardrobe|preparing for a long flight""",
    "situation": """have a big exam next week and feel unprepared|just moved to a new city and do not know anyone|
keep forgetting to drink water during the day|want to eat less sugar|argued with my best friend|
have trouble getting up in the morning|want to start running but get tired quickly|
spend too much time on my phone|need to give a speech at my sister's wedding|am starting a new job on Monday|
want to grow vegetables on my balcony|have too many things to do this week|feel lonely working from home|
want to adopt a cat|get bored on rainy weekends|have a noisy neighbour upstairs|want to read more but never find time|
am planning my first trip abroad|keep losing my keys|want to learn to cook but do not know where to begin""",
    "goal": """feel more energetic in the afternoon|make my mornings less rushed|keep my plants alive|
use less plastic at home|get along better with my roommate|make my small flat feel bigger|
stop putting things off|feel more confident at work|spend less on takeaway food|keep my kitchen clean|
remember names better|enjoy exercise more|make a long train journey pass quickly|cut down on coffee""",
    "aspect": """posture|memory|concentration|handwriting|cooking|public speaking|running speed|time management|
vocabulary|drawing|typing speed|patience|listening skills|singing voice|chess game""",
    "habit": """walking every day|reading before bed|learning a second language|eating more vegetables|
stretching in the morning|keeping a gratitude journal|cycling to work|spending time in nature|
cooking at home|volunteering|getting up early|playing a musical instrument|having a pet|swimming|
taking short breaks at work|writing things down""",
    "place": """Paris|Tokyo|a national park|Lisbon|the Scottish Highlands|Barcelona|New York|the seaside|
Kyoto|Amsterdam|Iceland|a small mountain village|Vienna|Prague|Cape Town|Sydney|Istanbul|Mexico City|
Berlin|Copenhagen|Edinburgh|Athens|Seoul|Marrakesh|Buenos Aires|Dublin""",
    "days": "two|three|four|five",
    "plan": """weekly exercise plan for a beginner|study schedule for the week before an exam|
morning routine for a busy parent|meal plan for a week of vegetarian dinners|
cleaning schedule for a small flat|monthly budget for a student living alone|
reading plan for the summer holidays|packing list for a beach holiday|checklist for moving house|
plan for a rainy day at home with children|training plan for a first five-kilometre run|
shopping list for a week of healthy lunches|daily routine for learning a new language|
schedule for a relaxed Saturday""",
    "meal": "breakfast|lunch|dinner|a snack|dessert|a picnic",
    "ingredient": """potatoes|chickpeas|tomatoes|pasta|cheese|onions|lentils|carrots|chicken|beans|bread|
mushrooms|peppers|yoghurt|oats|bananas|apples|tuna|tofu|courgettes|noodles|garlic|lemons|flour""",
    "dish": """a vegetable curry|pancakes|a tomato sauce|roast chicken|fried rice|a lentil soup|banana bread|
an omelette|guacamole|a simple risotto|hummus|a fruit salad|pizza dough|scones|a stir-fry|
apple crumble|a potato salad|lemonade|porridge|a chocolate mug cake""",
    "form": """haiku|limerick|four-line poem|short song|riddle|short rhyming poem|diary entry|
short fable""",
    "scene": """a quiet morning at the lake|a busy train station|a cat sleeping in the sun|the last day of summer|
a thunderstorm at night|an old bookshop|a child's first day at school|a lighthouse keeper|a garden in spring|
a walk in the autumn woods|a city at midnight|grandmother's kitchen|a long road trip|the sea at dawn|
a market on Sunday|a tired street musician|the smell of fresh bread|a broken umbrella""",
    "character": """a shy robot|an old fisherman|a curious fox|a young baker|a lonely lighthouse keeper|
a map-loving girl|a clumsy dragon|a retired astronaut|a talking tree|two rival chefs|a brave mouse|
a forgetful wizard|a young stone collector|an old piano teacher|a cat shopkeeper""",
    "event": """finds a mysterious key|learns to fly|gets lost in a big city|makes an unexpected friend|
wins a village contest|discovers a hidden garden|loses something important|travels back in time for a day|
has to save the harvest|tries to cook dinner for the first time|builds a boat|meets a stranger on a train|
opens a small cafe|goes on a journey to the sea""",
    "tone": "polite|short|friendly|formal|warm|cheerful",
    "note": "email|text message|note|letter",
    "recipient": """my landlord about a broken heater|a colleague thanking them for their help on a project|
my neighbour asking them to water my plants|a friend congratulating them on a new job|
a hotel asking about early check-in|my team announcing a meeting on Monday|
a customer apologising for a late delivery|my grandmother for her birthday|
a client following up after a meeting|a friend apologising for missing their party|
a shop asking for a refund|a new neighbour welcoming them to the street|
my coach saying I will miss training this week|a friend recommending a book""",
    "event_past": """the Industrial Revolution|the invention of the printing press|the fall of the Roman Empire|
the Renaissance|the first moon landing|the invention of the telephone|the Great Fire of London|
the building of the pyramids|the Silk Road|the discovery of penicillin|the invention of the steam engine|
the first flight of the Wright brothers|the building of the railways|the invention of paper""",
    "count": "three|four|five|six",
    "occasion": """a rainy Sunday afternoon|a team-building day at work|a cheap evening out|
a school science fair project|a family reunion|a surprise for an anniversary|a retirement gift|
a themed dinner party|keeping children busy on a long car trip|decorating a small bedroom|
a picnic in the park|a book club meeting|a gift for a new neighbour|a fundraising event""",
    "business": """a coffee shop near the sea|a dog-walking service|a small bookshop|a plant nursery|
a bicycle repair shop|a cleaning company|a knitting club|a food truck selling tacos|
a children's music school|a podcast about history|a hiking club|a flower shop|a pottery studio""",
    "story_title": """Cinderella|Hamlet|The Odyssey|Little Red Riding Hood|Robinson Crusoe|Alice in Wonderland|
Moby-Dick|Pride and Prejudice|The Tortoise and the Hare|Treasure Island|Snow White|Macbeth|Don Quixote|
The Little Prince|Jack and the Beanstalk|The Three Little Pigs|Frankenstein|Peter Pan""",
    "recommend": """a few board games for a family evening|some books for someone who loves adventure|
some easy houseplants for a dark room|a few films to watch on a rainy evening|
some quick healthy snacks for work|some podcasts for a long drive|a few indoor activities for winter|
some gifts for a friend who likes cooking|a few easy songs to learn on the piano|some day trips from a big city""",
    "choice": """living in a city|working from home|owning a car|buying a house|studying abroad|
having a dog|renting an apartment|cycling to work|learning online|getting up very early""",
    "topic": """first aid|saving money|healthy eating|caring for a pet|staying safe online|camping|
starting a new job|looking after your eyes|cooking safely|recycling""",
}
CHAT_SLOTS = {name: [" ".join(item.split()) for item in text.split("|")] for name, text in _SLOTS.items()}
_FIELD = re.compile(r"{(\w+)}")
_WORD = re.compile(r"[a-z]+")
_COMMON = set("a an and the of to in on for at is are do does i my me you your how what why can with "
              "some be it that this about who which as or by from".split())


def chat_prompts(count: int, seed: int) -> list[Prompt]:
    """`count` distinct conversational prompts, slots drawn with the seed; none equal to, inside,
    containing or a near-paraphrase of a held-out prompt. Templates are drawn in proportion to how
    many prompts each can make, up to 300, so a small one is not repeated until it runs out."""
    rng = random.Random(seed)
    names = sorted(CHAT_TEMPLATES)
    weights = [min(capacity(CHAT_TEMPLATES[n]), 300) for n in names]
    held_out = [content_words(h) for h in held_out_prompts()]

    def draw(_: int) -> Prompt:
        name = rng.choices(names, weights)[0]
        text = _fill(CHAT_TEMPLATES[name], rng)
        while any(near(content_words(text), h) for h in held_out):
            text = _fill(CHAT_TEMPLATES[name], rng)  # a paraphrase of a benchmark prompt: draw again
        return Prompt("chat", name, text)

    return _distinct(count, rng, draw)


def _fill(template: str, rng: random.Random, slots: dict[str, list[str]] = CHAT_SLOTS) -> str:
    used: set[str] = set()

    def slot(match: re.Match) -> str:
        # Never a value this prompt has already ({ingredient} and {ingredient2} differ).
        choices = [c for c in slots[_slot(match.group(1))] if c not in used]
        used.add(value := rng.choice(choices))
        return value

    text = _FIELD.sub(slot, template)
    return text[0].upper() + text[1:]


def capacity(template: str, slots: dict[str, list[str]] = CHAT_SLOTS) -> int:
    """How many distinct prompts a template can make."""
    return math.prod(len(slots[_slot(field)]) for field in _FIELD.findall(template))


def _slot(field: str) -> str:
    """The slot list a template field draws from: {ingredient2} is another {ingredient}."""
    return field.rstrip("0123456789")


def content_words(text: str, common: set[str] = _COMMON) -> set[str]:
    return set(_WORD.findall(text.lower())) - common


def near(words: set[str], held: set[str]) -> bool:
    """Most of the held-out prompt's content words (and at least two) appear in this prompt."""
    shared = len(words & held)
    return shared >= 2 and shared >= 0.6 * len(held)
