/* data.c — byte tokenizer, built-in stories, the distributed loader. See data.h. */
#define _POSIX_C_SOURCE 200809L
#include "core/data/data.h"
#include "core/runtime/env.h"
#include "core/runtime/offload.h"

#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/base/file.h"
#include "core/base/rng.h"
#include "core/runtime/world.h"
#include "core/base/error.h"

/* ------------------------------------------------------------------------------------------------------------ */
/* Tokenizer                                                                                                     */
/* ------------------------------------------------------------------------------------------------------------ */

/* The token starting at text[position], and how many bytes it spans (13 for the marker, else 1). */
static int token_at(const char *text, size_t length, size_t position, size_t *span) {
    size_t marker_length = sizeof DATA_EOT_TEXT - 1;
    if (text[position] == '<' && length - position >= marker_length &&
        memcmp(text + position, DATA_EOT_TEXT, marker_length) == 0) {
        *span = marker_length;
        return DATA_EOT;
    }
    *span = 1;
    return (unsigned char)text[position];
}

size_t data_encode(const char *text, size_t length, int *tokens) {
    size_t count = 0, span = 0;
    for (size_t position = 0; position < length; position += span)
        tokens[count++] = token_at(text, length, position, &span);
    return count;
}

/* A bounded text buffer that keeps counting past its end, so callers learn the full length (snprintf's contract). */
typedef struct text_writer {
    char *out;
    size_t size;
    size_t length;
} text_writer;

static void put_char(text_writer *writer, char c) {
    if (writer->length + 1 < writer->size) writer->out[writer->length] = c;
    writer->length++;
}

static void put_text(text_writer *writer, const char *text) {
    for (; *text; text++) put_char(writer, *text);
}

static size_t finish_text(text_writer *writer) {
    if (writer->size > 0) writer->out[writer->length < writer->size ? writer->length : writer->size - 1] = '\0';
    return writer->length;
}

size_t data_decode(const int *tokens, size_t count, char *out, size_t out_size) {
    text_writer writer = {out, out_size, 0};
    for (size_t i = 0; i < count; i++) {
        if (tokens[i] >= 0 && tokens[i] < DATA_BYTE_TOKENS) {
            put_char(&writer, (char)(unsigned char)tokens[i]);
        } else if (tokens[i] == DATA_EOT) {
            put_text(&writer, DATA_EOT_TEXT);
        } else {
            char marker[32];
            snprintf(marker, sizeof marker, "<|token %d|>", tokens[i]);
            put_text(&writer, marker);
        }
    }
    return finish_text(&writer);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Built-in stories                                                                                              */
/* ------------------------------------------------------------------------------------------------------------ */

/* Every list below starts with a consonant sound, so "a {word}" is always right. */
static const char *const girl_names[] = {"Lily", "Mia", "Sue", "Anna", "Lucy", "Emma", "Zoe", "Ella", "Amy", "Rose",
                                         "Kim", "Sara", "Molly", "Jane"};
static const char *const boy_names[] = {"Tom", "Ben", "Max", "Sam", "Tim", "Jack", "Leo", "Joe", "Bob", "Dan",
                                        "Finn", "Jake", "Timmy", "Billy"};
static const char *const animal_names[] = {"Spot", "Fluffy", "Bella", "Coco", "Pip", "Daisy", "Rex", "Sunny",
                                           "Buddy", "Milo", "Lola", "Nibbles", "Whiskers", "Peanut"};
static const char *const animals[] = {"dog", "cat", "bunny", "bird", "bear", "frog", "duck", "fox", "mouse",
                                      "puppy", "kitten", "pig", "squirrel", "turtle"};
static const char *const adjectives[] = {"curious", "shy", "brave", "happy", "clever", "kind", "small", "silly",
                                         "sweet", "busy", "friendly", "playful", "little", "gentle"};
static const char *const places[] = {"park", "forest", "garden", "beach", "farm", "lake", "hill", "meadow",
                                     "playground", "river", "zoo", "backyard", "pond", "woods"};
static const char *const homes[] = {"small house", "big house", "cozy house", "little house", "blue house",
                                    "yellow house", "white house", "house with a red door"};
static const char *const objects[] = {"ball", "kite", "red ball", "toy car", "blue hat", "teddy bear",
                                      "shiny stone", "little boat", "picture book", "yellow balloon", "doll",
                                      "toy train", "green box", "paper crown", "drum", "spoon"};
static const char *const hiding_spots[] = {"under a big leaf", "behind a tree", "inside a bush", "under the slide",
                                           "next to a rock", "in the tall grass", "under a bench", "by the water"};
static const char *const activities[] = {"run and jump", "sing songs", "draw pictures", "play outside",
                                         "look at the clouds", "dance", "read books", "pick flowers",
                                         "splash in puddles", "build with blocks", "play games", "watch the birds"};
static const char *const happy_words[] = {"happy", "glad", "proud", "excited", "thankful", "cheerful"};
static const char *const sad_words[] = {"sad", "upset", "worried", "unhappy", "lonely"};
static const char *const scared_words[] = {"scared", "afraid", "nervous", "frightened"};
static const char *const weather_words[] = {"sunny", "windy", "warm", "bright", "cold", "cloudy"};
static const char *const foods[] = {"cookie", "sandwich", "banana", "carrot", "piece of cake", "muffin",
                                    "pear", "bowl of berries"};
static const char *const noises[] = {"a little owl", "the wind in the trees", "a small cat", "the old door",
                                     "a branch on the window", "a sleepy frog", "the rain on the roof"};
static const char *const skills[] = {"ride a bike", "swim", "climb a tree", "jump rope", "fly a kite",
                                     "whistle", "catch a ball", "skip stones"};
static const char *const gifts[] = {"card", "drawing", "necklace of flowers", "cake", "little song", "paper star"};
static const char *const seeds[] = {"sunflower", "tomato", "pumpkin", "rose", "bean", "carrot"};
static const char *const grown_ups[] = {"Mom", "Dad", "Grandma", "Grandpa"};

#define COUNT_OF(list) ((int)(sizeof(list) / sizeof((list)[0])))

/* One story being written: the values its placeholders stand for, and the counter of its random draws. */
typedef struct story {
    text_writer *writer;
    int at_line_start;             /* no space before the next sentence */
    uint64_t seed, stream, draws;  /* draw n of story i is rng_bits(seed, stream of story i, n) */
    const char *name, *kind, *adjective, *he, *him, *his, *himself;
    const char *friend, *friend_kind, *friend_he, *friend_him, *friend_his, *friend_himself;
    const char *place, *home, *object, *hiding, *activity, *happy, *sad, *scared, *weather;
    const char *food, *noise, *skill, *gift, *seed_kind, *grown_up;
} story;

static int draw(story *s, int choices) {
    return (int)(rng_bits(s->seed, s->stream, s->draws++) % (uint64_t)choices);
}
#define CHOOSE(s, list) ((list)[draw((s), COUNT_OF(list))])

/* A character: a child or an animal with a name, and the pronouns that go with it. */
static void make_character(story *s, const char **name, const char **kind, const char **he, const char **him,
                           const char **his, const char **himself) {
    int girl = draw(s, 2);
    *he = girl ? "she" : "he";
    *him = girl ? "her" : "him";
    *his = girl ? "her" : "his";
    *himself = girl ? "herself" : "himself";
    if (draw(s, 2)) {
        *name = girl ? CHOOSE(s, girl_names) : CHOOSE(s, boy_names);
        *kind = girl ? "girl" : "boy";
    } else {
        *name = CHOOSE(s, animal_names);
        *kind = CHOOSE(s, animals);
    }
}

/* The value of placeholder `word`; a capital first letter asks for a capitalised value ({He} → "She"). */
static const char *placeholder_value(const story *s, const char *word) {
    struct { const char *word, *value; } table[] = {
        {"name", s->name}, {"kind", s->kind}, {"adjective", s->adjective}, {"he", s->he}, {"him", s->him},
        {"his", s->his}, {"himself", s->himself}, {"friend", s->friend}, {"friend_kind", s->friend_kind},
        {"friend_he", s->friend_he}, {"friend_him", s->friend_him}, {"friend_his", s->friend_his},
        {"friend_himself", s->friend_himself}, {"place", s->place}, {"home", s->home},
        {"object", s->object}, {"hiding", s->hiding}, {"activity", s->activity}, {"happy", s->happy},
        {"sad", s->sad}, {"scared", s->scared}, {"weather", s->weather}, {"food", s->food}, {"noise", s->noise},
        {"skill", s->skill}, {"gift", s->gift}, {"seed", s->seed_kind}, {"grown_up", s->grown_up},
    };
    char lower[32];
    snprintf(lower, sizeof lower, "%s", word);
    lower[0] = (char)tolower((unsigned char)lower[0]);
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (strcmp(table[i].word, lower) == 0) return table[i].value;
    return NULL;
}

/* Writes one sentence with its placeholders filled, a space before it unless a line just began. "" writes nothing
 * (an optional sentence left out); "\n\n" starts a paragraph. An unknown placeholder is a bug in the templates
 * below, so it is written visibly as "{?word}" rather than skipped. */
static void say(story *s, const char *sentence) {
    if (sentence[0] == '\0') return;
    if (sentence[0] == '\n') {
        put_text(s->writer, sentence);
        s->at_line_start = 1;
        return;
    }
    if (!s->at_line_start) put_char(s->writer, ' ');
    s->at_line_start = 0;
    for (const char *c = sentence; *c; c++) {
        const char *close = *c == '{' ? strchr(c, '}') : NULL;
        if (close == NULL || close - c - 1 >= 32) {
            put_char(s->writer, *c);
            continue;
        }
        char word[32];
        memcpy(word, c + 1, (size_t)(close - c - 1));
        word[close - c - 1] = '\0';
        const char *value = placeholder_value(s, word);
        if (value == NULL) {
            put_text(s->writer, "{?");
            put_text(s->writer, word);
            put_char(s->writer, '}');
        } else {
            put_char(s->writer, isupper((unsigned char)word[0]) ? (char)toupper((unsigned char)value[0]) : value[0]);
            put_text(s->writer, value + 1);
        }
        c = close;
    }
}

/* A plot is a list of steps; each step is up to STEP_CHOICES ways to say it, one picked at random. */
#define STEP_CHOICES 4
typedef const char *const plot_step[STEP_CHOICES];

static void tell(story *s, const plot_step *steps, int step_count) {
    for (int i = 0; i < step_count; i++) {
        int choices = 0;
        while (choices < STEP_CHOICES && steps[i][choices] != NULL) choices++;
        say(s, steps[i][draw(s, choices)]);
    }
}

static const plot_step opening[] = {
    {"Once upon a time, there was a {adjective} {kind} named {name}.",
     "Once there was a {adjective} {kind} named {name}.", "There once was a {adjective} {kind} called {name}.",
     "{Name} was a {adjective} {kind}."},
    {"{He} lived in a {home} near the {place}.", "{He} loved to {activity}.",
     "Every day, {he} liked to {activity}.", ""},
    {"{Name} had a friend named {friend}.", "{His} best friend was a {friend_kind} named {friend}.", "", NULL},
};

static const plot_step lost_plot[] = {
    {"One day, {name} took {his} {object} to the {place}.",
     "One {weather} morning, {name} went to the {place} with {his} {object}.",
     "One day, {name} and {his} {object} went to play at the {place}.", NULL},
    {"{He} played with it all day.", "{He} had so much fun.", "{He} ran and laughed in the {weather} air.", NULL},
    {"But when it was time to go home, the {object} was gone!",
     "Then {he} looked down, and {his} {object} was not there!", "Soon {name} saw that {his} {object} was lost.",
     NULL},
    {"{Name} felt very {sad}.", "{Name} was {sad} and began to cry.", "{He} did not know what to do.", NULL},
    {"Just then, {friend} came by.", "Then {friend} walked up to {him}.",
     "Soon {friend} came over to see what was wrong.", NULL},
    {"\"Why are you {sad}?\" asked {friend}.", "\"What is wrong?\" asked {friend}.", "", NULL},
    {"\"I lost my {object},\" said {name}.", "\"I cannot find my {object},\" {name} said.", NULL, NULL},
    {"\"Do not worry, I will help you,\" said {friend}.", "\"Let us look for it together,\" said {friend}.",
     "{Friend} wanted to help.", NULL},
    {"They looked and looked. At last, {friend} found it {hiding}.",
     "They looked everywhere, and there it was, {hiding}!", "They found the {object} {hiding}.", NULL},
    {"{Name} was so {happy}. \"Thank you, {friend}!\" {he} said.",
     "{Name} gave {friend} a big hug. {He} felt {happy} again.", "{Name} smiled. {He} was very {happy}.", NULL},
    {"\n\n", "", NULL, NULL},
    {"From that day on, {name} always took good care of {his} {object}.",
     "Now {name} knew that friends help each other.",
     "After that, {name} and {friend} played with the {object} every day.", NULL},
};

static const plot_step share_plot[] = {
    {"One day, {name} had a new {object}.", "{Name} got a {object} from {grown_up}.",
     "{Name} found a {object} at the {place}.", NULL},
    {"{He} loved it very much.", "It was the best {object} in the world.", "{He} played with it all the time.",
     NULL},
    {"{Friend} saw the {object} and wanted to play with it too.",
     "Then {friend} came and asked, \"Can I play with your {object}?\"", NULL, NULL},
    {"\"No, it is mine!\" said {name}.", "At first, {name} did not want to share.",
     "{Name} held the {object} close and said, \"No.\"", NULL},
    {"{Friend} looked {sad} and walked away.", "{Friend} felt {sad}. {Friend_he} sat down all alone.",
     "{Friend} was {sad}, and {friend_his} eyes were wet.", NULL},
    {"{Name} did not like to see {friend} so {sad}.", "{Name} thought about it for a long time.",
     "Then {name} felt bad inside.", NULL},
    {"{He} ran to {friend} and said, \"Here, you can play with my {object}.\"",
     "{He} gave the {object} to {friend} and said, \"Let us share.\"", NULL, NULL},
    {"{Friend} smiled a big smile.", "{Friend} was so {happy}.", "\"Thank you!\" said {friend}.", NULL},
    {"They played together at the {place} all day.", "They took turns and had lots of fun.",
     "They laughed and played until the sun went down.", NULL},
    {"\n\n", "", NULL, NULL},
    {"{Name} learned that sharing makes everyone {happy}.", "Playing together was more fun than playing alone.",
     "From that day on, {name} and {friend} shared everything.", NULL},
};

static const plot_step fear_plot[] = {
    {"One night, {name} was in bed.", "One dark night, {name} could not sleep.",
     "It was late, and {name} was in {his} room.", NULL},
    {"Then {he} heard a loud noise outside.", "Suddenly, there was a strange sound.",
     "{He} heard a tap, tap, tap at the window.", NULL},
    {"{Name} was very {scared}.", "{He} felt {scared} and hid under the blanket.",
     "{Name} was so {scared} that {he} shook.", NULL},
    {"\"Who is there?\" {he} asked.", "{He} wanted to call for {grown_up}.", "", NULL},
    {"{Name} took a deep breath and looked out.", "{He} was brave and opened {his} eyes.",
     "Slowly, {name} got up to look.", NULL},
    {"It was only {noise}!", "It was just {noise}.", "There was {noise}, and nothing else.", NULL},
    {"{Name} laughed.", "{Name} smiled and was not {scared} anymore.", "{Name} felt silly and {happy}.", NULL},
    {"\n\n", "", NULL, NULL},
    {"Then {he} went back to sleep.", "{He} closed {his} eyes and slept until morning.",
     "From that night on, {name} was not afraid of the dark.", NULL},
};

static const plot_step learn_plot[] = {
    {"{Name} wanted to learn to {skill}.", "One day, {name} saw {friend} {skill}.",
     "More than anything, {name} wanted to {skill}.", NULL},
    {"It looked so fun!", "{He} wanted to try it too.", "", NULL},
    {"{He} tried, but {he} fell down.", "The first time, it did not work.", "{He} tried and tried, but it was hard.",
     NULL},
    {"{Name} felt {sad}.", "{Name} wanted to give up.", "\"I can not do it,\" said {name}.", NULL},
    {"{Grown_up} said, \"Keep trying. You can do it!\"", "{Friend} said, \"Do not give up. Try again!\"",
     "Then {grown_up} gave {him} a hug and said, \"Try one more time.\"", NULL},
    {"So {name} tried again, and again, and again.", "{Name} practiced every day at the {place}.",
     "{He} did not give up.", NULL},
    {"At last, {he} could {skill}!", "One day, {name} did it! {He} could {skill}!",
     "Soon {name} could {skill} all by {himself}.", NULL},
    {"{Name} felt so {happy}.", "{He} was very {happy} and proud.", "Everyone clapped for {name}.", NULL},
    {"\n\n", "", NULL, NULL},
    {"{Name} learned that trying again is how we learn.", "Now {name} loves to {skill} every day.",
     "{Name} knew that {he} could do hard things.", NULL},
};

static const plot_step help_plot[] = {
    {"One {weather} day, {name} was playing at the {place}.", "One day, {name} went for a walk in the {place}.",
     "{Name} was on the way to the {place}.", NULL},
    {"{He} heard someone crying.", "Then {he} saw {friend} sitting alone.", "{He} saw {friend} near a big tree.",
     NULL},
    {"{Friend} had hurt {friend_his} leg.", "{Friend}'s {object} was stuck up in a tree.",
     "{Friend} could not find the way home.", NULL},
    {"\"Can you help me?\" asked {friend}.", "{Friend} looked {sad} and {scared}.", "", NULL},
    {"\"I will help you,\" said {name}.", "{Name} wanted to help {friend_him}.", "{Name} knew what to do.", NULL},
    {"{He} went to get {grown_up}.", "{He} thought hard and found a way.", "{He} held {friend}'s hand.", NULL},
    {"Soon everything was fine again.", "Together, they fixed the problem.", "It took a long time, but it worked.",
     NULL},
    {"{Friend} was very {happy}. \"Thank you, {name}!\"", "{Friend} smiled and said, \"You are a good friend.\"",
     "{Friend} gave {name} a big hug.", NULL},
    {"\n\n", "", NULL, NULL},
    {"{Name} felt warm inside. Helping others felt good.", "From that day on, {name} and {friend} were best friends.",
     "{Name} learned that being kind makes the day better.", NULL},
};

static const plot_step rain_plot[] = {
    {"One morning, {name} wanted to go to the {place}.", "{Name} and {friend} planned a picnic at the {place}.",
     "{Name} wanted to {activity} outside.", NULL},
    {"{He} packed a {food} and {his} {object}.", "{He} was very excited.", "{Grown_up} made a {food} for the trip.",
     NULL},
    {"But then dark clouds came, and it began to rain.", "But when {he} looked outside, it was raining.",
     "Then big drops of rain started to fall.", NULL},
    {"{Name} was {sad}.", "\"Oh no!\" said {name}. {He} felt {sad}.", "{Name} frowned. Now {he} could not go.",
     NULL},
    {"Then {grown_up} had an idea.", "Then {friend} had a good idea.", "Then {name} had an idea.", NULL},
    {"\"We can have a picnic inside!\"", "They made a tent with a blanket in the living room.",
     "They sat on the floor and ate the {food} together.", NULL},
    {"They played with the {object} and told stories.", "They sang songs and listened to the rain.",
     "They laughed and had lots of fun.", NULL},
    {"\n\n", "", NULL, NULL},
    {"It was the best rainy day ever.", "{Name} learned that a rainy day can still be fun.",
     "When the sun came out, they ran outside to jump in the puddles.", NULL},
};

static const plot_step gift_plot[] = {
    {"Tomorrow was {grown_up}'s birthday.", "{Name} wanted to make a gift for {grown_up}.",
     "One day, {name} wanted to surprise {grown_up}.", NULL},
    {"{He} thought and thought.", "But {he} did not know what to make.", "", NULL},
    {"Then {he} had an idea: {he} would make a {gift}!", "{Friend} said, \"Why not make a {gift}?\"",
     "{He} decided to make a {gift}.", NULL},
    {"{Name} worked very hard.", "It was hard, and {he} made a mess.", "{He} worked on it all afternoon.", NULL},
    {"At last, the {gift} was ready.", "Soon the {gift} was done. It was not perfect, but it was made with love.",
     "When {he} was done, {he} hid it behind {his} back.", NULL},
    {"{Name} gave the {gift} to {grown_up}.", "\"Surprise!\" said {name}, and gave {grown_up} the {gift}.", NULL,
     NULL},
    {"{Grown_up} smiled and said, \"I love it!\"", "{Grown_up} was so {happy} and gave {name} a big hug.",
     "{Grown_up} said, \"This is the best gift ever.\"", NULL},
    {"\n\n", "", NULL, NULL},
    {"{Name} felt {happy}. Giving was even better than getting.",
     "{Name} learned that a gift from the heart is the best gift.", "That night, {name} went to bed smiling.", NULL},
};

static const plot_step garden_plot[] = {
    {"One day, {grown_up} gave {name} a little {seed} seed.", "{Name} found a {seed} seed in the {place}.",
     "{Name} wanted to grow a {seed}.", NULL},
    {"{He} dug a hole and put the seed in the dirt.", "{He} planted the seed in the garden.", NULL, NULL},
    {"Every day, {he} gave it water.", "{He} watered it every morning and every night.",
     "{He} sang to it and gave it water.", NULL},
    {"But nothing happened.", "But the seed did not grow.", "Days went by, and there was nothing.", NULL},
    {"{Name} felt {sad}. \"Will it ever grow?\" {he} asked.", "{Name} was {sad} and wanted to stop.",
     "{Name} was not very patient.", NULL},
    {"\"Be patient,\" said {grown_up}.", "\"Good things take time,\" said {friend}.", "", NULL},
    {"Then one morning, {name} saw a tiny green plant!", "Then one day, a little green leaf came up!",
     "After many days, a small plant came out of the dirt.", NULL},
    {"It grew and grew, and soon there was a big {seed}.", "The plant grew tall in the sun.",
     "Soon the garden had a beautiful {seed}.", NULL},
    {"{Name} was so {happy}!", "{Name} jumped up and down. {He} was very {happy}.", NULL, NULL},
    {"\n\n", "", NULL, NULL},
    {"{Name} learned that good things take time.", "{Name} shared the {seed} with {friend}.",
     "Now {name} takes care of the garden every day.", NULL},
};

static const plot_step closing[] = {
    {"The end.", "", "", NULL},
};

#define STEP_COUNT(plot) ((int)(sizeof(plot) / sizeof((plot)[0])))

static void write_story(story *s) {
    make_character(s, &s->name, &s->kind, &s->he, &s->him, &s->his, &s->himself);
    do {
        make_character(s, &s->friend, &s->friend_kind, &s->friend_he, &s->friend_him, &s->friend_his,
                       &s->friend_himself);
    } while (strcmp(s->friend, s->name) == 0);
    s->adjective = CHOOSE(s, adjectives);
    s->place = CHOOSE(s, places);
    s->home = CHOOSE(s, homes);
    s->object = CHOOSE(s, objects);
    s->hiding = CHOOSE(s, hiding_spots);
    s->activity = CHOOSE(s, activities);
    s->happy = CHOOSE(s, happy_words);
    s->sad = CHOOSE(s, sad_words);
    s->scared = CHOOSE(s, scared_words);
    s->weather = CHOOSE(s, weather_words);
    s->food = CHOOSE(s, foods);
    s->noise = CHOOSE(s, noises);
    s->skill = CHOOSE(s, skills);
    s->gift = CHOOSE(s, gifts);
    s->seed_kind = CHOOSE(s, seeds);
    s->grown_up = CHOOSE(s, grown_ups);

    tell(s, opening, STEP_COUNT(opening));
    switch (draw(s, 8)) {
    case 0: tell(s, lost_plot, STEP_COUNT(lost_plot)); break;
    case 1: tell(s, share_plot, STEP_COUNT(share_plot)); break;
    case 2: tell(s, fear_plot, STEP_COUNT(fear_plot)); break;
    case 3: tell(s, learn_plot, STEP_COUNT(learn_plot)); break;
    case 4: tell(s, help_plot, STEP_COUNT(help_plot)); break;
    case 5: tell(s, rain_plot, STEP_COUNT(rain_plot)); break;
    case 6: tell(s, gift_plot, STEP_COUNT(gift_plot)); break;
    default: tell(s, garden_plot, STEP_COUNT(garden_plot)); break;
    }
    tell(s, closing, STEP_COUNT(closing));
}

size_t data_generate_stories(uint64_t seed, int count, char *out, size_t out_size) {
    text_writer writer = {out, out_size, 0};
    uint64_t first_stream = rng_stream_of("data.stories");
    for (int i = 0; i < count; i++) {
        story s = {.writer = &writer, .at_line_start = 1, .seed = seed, .stream = first_stream + (uint64_t)i};
        write_story(&s);
        put_text(&writer, "\n" DATA_EOT_TEXT "\n");
    }
    return finish_text(&writer);
}

/* ------------------------------------------------------------------------------------------------------------ */
/* TinyStories text: the stories as the dataset gives them                                                      */
/* ------------------------------------------------------------------------------------------------------------ */

/* Python's str.isspace(), which str.strip() removes: the code points whose bidirectional class is WS, B or S, or
 * whose category is Zs. */
static int python_space(uint32_t code) {
    return (code >= 0x09 && code <= 0x0d) || (code >= 0x1c && code <= 0x20) || code == 0x85 || code == 0xa0 ||
           code == 0x1680 || (code >= 0x2000 && code <= 0x200a) || code == 0x2028 || code == 0x2029 ||
           code == 0x202f || code == 0x205f || code == 0x3000;
}

/* The code point a well-formed UTF-8 sequence of exactly `length` bytes encodes, or -1 (never a space, so bytes
 * Python could not have decoded are never stripped). */
static long utf8_code(const unsigned char *bytes, size_t length) {
    static const unsigned char lead_mask[5] = {0, 0x7f, 0x1f, 0x0f, 0x07};
    static const uint32_t smallest[5] = {0, 0, 0x80, 0x800, 0x10000};
    size_t expected = bytes[0] < 0x80 ? 1 : bytes[0] >= 0xc2 && bytes[0] < 0xe0 ? 2 : (bytes[0] & 0xf0) == 0xe0 ? 3
                    : bytes[0] >= 0xf0 && bytes[0] < 0xf5 ? 4 : 0;
    if (expected == 0 || expected != length) return -1;
    uint32_t code = bytes[0] & lead_mask[length];
    for (size_t i = 1; i < length; i++) {
        if ((bytes[i] & 0xc0) != 0x80) return -1;
        code = code << 6 | (bytes[i] & 0x3f);
    }
    return code < smallest[length] || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff) ? -1 : (long)code;
}

/* How many bytes of Python whitespace text[0 .. length) starts with. */
static size_t leading_space(const unsigned char *text, size_t length) {
    size_t at = 0;
    while (at < length) {
        size_t width = text[at] < 0x80 ? 1 : text[at] < 0xe0 ? 2 : text[at] < 0xf0 ? 3 : 4;
        long code = width <= length - at ? utf8_code(text + at, width) : -1;
        if (code < 0 || !python_space((uint32_t)code)) break;
        at += width;
    }
    return at;
}

/* How many bytes of Python whitespace text[0 .. length) ends with. */
static size_t trailing_space(const unsigned char *text, size_t length) {
    size_t end = length;
    while (end > 0) {
        size_t start = end - 1;
        while (start > 0 && end - start < 4 && (text[start] & 0xc0) == 0x80) start--;
        long code = utf8_code(text + start, end - start);
        if (code < 0 || !python_space((uint32_t)code)) break;
        end = start;
    }
    return length - end;
}

data_story_reader data_story_reader_of(const char *text, size_t length) {
    return (data_story_reader){.text = text, .length = length};
}

void data_story_reader_free(data_story_reader *reader) {
    free(reader->scratch);
    reader->scratch = NULL;
    reader->scratch_size = 0;
}

const char *data_story_next(data_story_reader *reader, size_t *story_length) {
    size_t marker_length = sizeof DATA_EOT_TEXT - 1;
    while (!reader->out_of_memory && reader->at < reader->length) {
        const char *start = reader->text + reader->at, *end = reader->text + reader->length, *marker = NULL;
        for (const char *c = memchr(start, '<', (size_t)(end - start)); c != NULL && marker == NULL;
             c = memchr(c + 1, '<', (size_t)(end - c - 1)))
            if ((size_t)(end - c) >= marker_length && memcmp(c, DATA_EOT_TEXT, marker_length) == 0) marker = c;
        size_t piece = (size_t)((marker != NULL ? marker : end) - start);
        reader->at = marker != NULL ? (size_t)(marker - reader->text) + marker_length : reader->length;
        const char *story = start;
        if (memchr(start, '\r', piece) != NULL) { /* universal newlines: "\r\n" and a lone "\r" become "\n" */
            if (piece > reader->scratch_size) {
                char *grown = realloc(reader->scratch, piece);
                if (grown == NULL) {
                    reader->out_of_memory = 1;
                    return NULL;
                }
                reader->scratch = grown, reader->scratch_size = piece;
            }
            size_t kept = 0;
            for (size_t i = 0; i < piece; i++) {
                reader->scratch[kept++] = start[i] == '\r' ? '\n' : start[i];
                if (start[i] == '\r' && i + 1 < piece && start[i + 1] == '\n') i++;
            }
            story = reader->scratch, piece = kept;
        }
        size_t lead = leading_space((const unsigned char *)story, piece);
        size_t trail = lead < piece ? trailing_space((const unsigned char *)story + lead, piece - lead) : 0;
        if (lead + trail < piece) {
            reader->stories++;
            reader->piece_at = (size_t)(start - reader->text);
            *story_length = piece - lead - trail;
            return story + lead;
        }
    }
    return NULL;
}

int data_encode_stories(data_story_reader *reader, tok_tokenizer *tokenizer, size_t budget, tok_ids *ids,
                        char *error, size_t error_size) {
    int eot = tokenizer != NULL ? tok_special_id(tokenizer, DATA_EOT_TEXT) : DATA_EOT;
    if (eot < 0)
        return error_set(error, error_size, "tokenizer %s has no %s token to put between stories", tokenizer->source,
                         DATA_EOT_TEXT);
    size_t first = reader->at, story_length = 0;
    const char *story;
    while (reader->at - first < budget && (story = data_story_next(reader, &story_length)) != NULL) {
        size_t need = ids->count + 1 + (tokenizer != NULL ? 0 : story_length);
        if (need > ids->capacity) { /* bytes: room for the story's ids and the separator; BPE: tok_encode grows it */
            size_t capacity = need > 2 * ids->capacity ? need : 2 * ids->capacity;
            int *grown = realloc(ids->ids, capacity * sizeof *grown);
            if (grown == NULL) return error_set(error, error_size, "out of memory for %zu ids", capacity);
            ids->ids = grown, ids->capacity = capacity;
        }
        if (reader->stories > 1) ids->ids[ids->count++] = eot;
        if (tokenizer == NULL) {
            ids->count += data_encode(story, story_length, ids->ids + ids->count);
        } else {
            char reason[512];
            if (tok_encode(tokenizer, story, story_length, ids, reason, sizeof reason) != 0)
                return error_set(error, error_size, "story %zu (its piece at byte %zu of the text): %s",
                                 reader->stories, reader->piece_at, reason);
        }
    }
    if (reader->out_of_memory) return error_set(error, error_size, "out of memory for story %zu", reader->stories + 1);
    return reader->at < reader->length ? 1 : 0;
}

/* ------------------------------------------------------------------------------------------------------------ */
/* Loader                                                                                                        */
/* ------------------------------------------------------------------------------------------------------------ */

static int fail(data_loader *loader, const char *format, ...) __attribute__((format(printf, 2, 3)));
static int fail(data_loader *loader, const char *format, ...) {
    context *ctx = loader->ctx;
    int prefix = snprintf(ctx->error, sizeof ctx->error, "rank %d: %s: ", ctx->rank, loader->source);
    if (prefix < 0 || (size_t)prefix >= sizeof ctx->error) return -1;
    va_list args;
    va_start(args, format);
    vsnprintf(ctx->error + prefix, sizeof ctx->error - (size_t)prefix, format, args);
    va_end(args);
    return -1;
}

static int ends_with(const char *text, const char *suffix) {
    size_t text_length = strlen(text), suffix_length = strlen(suffix);
    return text_length >= suffix_length && strcmp(text + text_length - suffix_length, suffix) == 0;
}

/* A regular file opened for reading, and its size. */
static int open_regular(data_loader *loader, const char *path, FILE **file, size_t *size) {
    struct stat info;
    if (stat(path, &info) != 0) return fail(loader, "cannot open: %s", strerror(errno));
    if (!S_ISREG(info.st_mode)) return fail(loader, "not a regular file");
    *file = fopen(path, "rb");
    if (*file == NULL) return fail(loader, "cannot open: %s", strerror(errno));
    *size = (size_t)info.st_size;
    return 0;
}

/* The whole file into a tracked buffer of category data. */
static int read_file(data_loader *loader, const char *path, const char *owner, unsigned char **bytes,
                     size_t *size) {
    FILE *file = NULL;
    if (open_regular(loader, path, &file, size) != 0) return -1;
    *bytes = mem_alloc_uninitialized_typed(offload_data_pool(loader->ctx), *size > 0 ? *size : 1, MEM_DATA,
                                           DTYPE_UINT8, owner);
    size_t got = fread(*bytes, 1, *size, file);
    int read_error = ferror(file);
    fclose(file);
    if (got != *size) {
        mem_free(offload_data_pool(loader->ctx), *bytes);
        *bytes = NULL;
        return fail(loader, "read %zu of %zu bytes%s", got, *size, read_error ? " (read error)" : "");
    }
    return 0;
}

/* The stream's buffer for `count` ids in the loader's width, tracked as data; the ids are set by set_token. */
static void allocate_stream(data_loader *loader, size_t count) {
    loader->token_count = count;
    loader->token_bytes = count * (size_t)loader->token_width;
    loader->tokens = mem_alloc_uninitialized_typed(offload_data_pool(loader->ctx),
                                                   loader->token_bytes > 0 ? loader->token_bytes : 1, MEM_DATA,
                                                   loader->token_width == 2 ? DTYPE_UINT16 : DTYPE_INT32,
                                                   "data.tokens");
}

static void set_token(data_loader *loader, size_t i, uint32_t id) {
    if (loader->token_width == 2) ((uint16_t *)loader->tokens)[i] = (uint16_t)id;
    else ((uint32_t *)loader->tokens)[i] = id;
}

static int refuse_id(data_loader *loader, uint64_t id, size_t position);

/* Ids from a plain list into the tracked stream of exactly their count; the list is freed either way. */
static int stream_from_ids(data_loader *loader, tok_ids *ids) {
    int status = 0;
    allocate_stream(loader, ids->count);
    for (size_t i = 0; i < ids->count && status == 0; i++) {
        if (ids->ids[i] < 0 || ids->ids[i] >= loader->vocab_size) status = refuse_id(loader, (uint64_t)ids->ids[i], i);
        else set_token(loader, i, (uint32_t)ids->ids[i]);
    }
    tok_ids_free(ids);
    if (status != 0) {
        mem_free(offload_data_pool(loader->ctx), loader->tokens);
        loader->tokens = NULL;
    }
    return status;
}

/* Text through the loader's BPE tokenizer (Qwen2's), whole: the ids come in a plain list first, then into the
 * stream. */
static int tokenize_bpe(data_loader *loader, const char *text, size_t length) {
    tok_ids ids = {0};
    char reason[512];
    if (tok_encode(loader->tokenizer, text, length, &ids, reason, sizeof reason) != 0)
        return fail(loader, "%s (tokenizer %s)", reason, loader->tokenizer->source);
    return stream_from_ids(loader, &ids);
}

/* Text to the token stream: count first, so the tracked stream is exactly the size it holds. */
static int tokenize_text(data_loader *loader, const char *text, size_t length) {
    if (loader->tokenizer != NULL) return tokenize_bpe(loader, text, length);
    size_t count = 0, span = 0;
    for (size_t position = 0; position < length; position += span, count++) token_at(text, length, position, &span);
    allocate_stream(loader, count);
    count = 0;
    for (size_t position = 0; position < length; position += span)
        set_token(loader, count++, (uint32_t)token_at(text, length, position, &span));
    return 0;
}

/* A TinyStories text file, story by story as the dataset gives them (data.h: data_story_next), <|endoftext|>
 * between stories (data_encode_stories). Bytes: counted first, so the stream is exactly its size with no list of
 * ints on the way. */
static int tokenize_stories(data_loader *loader, const char *text, size_t length) {
    data_story_reader reader = data_story_reader_of(text, length);
    char reason[512];
    int status = 0;
    if (loader->tokenizer != NULL) {
        tok_ids ids = {0};
        if (data_encode_stories(&reader, loader->tokenizer, SIZE_MAX, &ids, reason, sizeof reason) < 0) {
            tok_ids_free(&ids);
            status = fail(loader, "%s (tokenizer %s)", reason, loader->tokenizer->source);
        } else {
            status = stream_from_ids(loader, &ids);
        }
    } else {
        size_t count = 0, story_length = 0;
        const char *story;
        while ((story = data_story_next(&reader, &story_length)) != NULL)
            count += story_length + (reader.stories > 1);
        if (!reader.out_of_memory) {
            allocate_stream(loader, count);
            data_story_reader_free(&reader);
            reader = data_story_reader_of(text, length);
            count = 0;
            while ((story = data_story_next(&reader, &story_length)) != NULL) {
                if (reader.stories > 1) set_token(loader, count++, DATA_EOT);
                for (size_t i = 0; i < story_length; i++) set_token(loader, count++, (unsigned char)story[i]);
            }
        }
        if (reader.out_of_memory) {
            if (loader->tokens != NULL) mem_free(offload_data_pool(loader->ctx), loader->tokens);
            loader->tokens = NULL;
            status = fail(loader, "out of memory for story %zu's newlines", reader.stories + 1);
        }
    }
    data_story_reader_free(&reader);
    return status;
}

static int load_text(data_loader *loader, const char *path) {
    unsigned char *bytes = NULL;
    size_t size = 0;
    if (read_file(loader, path, "data.text", &bytes, &size) != 0) return -1;
    int status = tokenize_stories(loader, (const char *)bytes, size);
    mem_free(offload_data_pool(loader->ctx), bytes);
    return status;
}

static int load_generated(data_loader *loader) {
    size_t length = data_generate_stories(loader->seed, DATA_DEFAULT_STORIES, NULL, 0);
    char *text = mem_alloc_uninitialized_typed(offload_data_pool(loader->ctx), length + 1, MEM_DATA, DTYPE_UINT8,
                                               "data.text");
    data_generate_stories(loader->seed, DATA_DEFAULT_STORIES, text, length + 1);
    int status = tokenize_text(loader, text, length);
    mem_free(offload_data_pool(loader->ctx), text);
    return status;
}

/* ---- token files (the format is in data.h) ---- */

static void put_le(unsigned char *out, uint64_t value, int bytes) {
    for (int i = 0; i < bytes; i++) out[i] = (unsigned char)(value >> (8 * i));
}

static uint64_t get_le(const unsigned char *in, int bytes) {
    uint64_t value = 0;
    for (int i = bytes - 1; i >= 0; i--) value = value << 8 | in[i];
    return value;
}

int data_token_width(int vocab_size) { return vocab_size <= 65536 ? 2 : 4; }

/* Where a token file's ids start, their width and count, from its header; or the old headerless uint16 format when
 * the file does not start with the magic. */
typedef struct token_file_layout {
    size_t ids_offset;
    int width;
    size_t count;
} token_file_layout;

static int token_file_layout_of(data_loader *loader, FILE *file, size_t size, token_file_layout *layout) {
    unsigned char header[DATA_TOKENS_HEADER_BYTES];
    size_t magic_bytes = sizeof DATA_TOKENS_MAGIC - 1;
    size_t got = fread(header, 1, size < sizeof header ? size : sizeof header, file);
    if (got < magic_bytes || memcmp(header, DATA_TOKENS_MAGIC, magic_bytes) != 0) { /* the old format */
        if (size % 2 != 0) return fail(loader, "%zu bytes, not a whole number of uint16 tokens", size);
        *layout = (token_file_layout){0, 2, size / 2};
        return 0;
    }
    if (got < sizeof header)
        return fail(loader, "%zu bytes: the token file header (magic %s) needs %d", size, DATA_TOKENS_MAGIC,
                    DATA_TOKENS_HEADER_BYTES);
    uint64_t version = get_le(header + 8, 4), width = get_le(header + 12, 4), count = get_le(header + 16, 8);
    if (version != DATA_TOKENS_VERSION)
        return fail(loader, "token file version %llu; this build reads version %d", (unsigned long long)version,
                    DATA_TOKENS_VERSION);
    if (width != 2 && width != 4)
        return fail(loader, "id width %llu in the header; token files hold 2 or 4 bytes per id",
                    (unsigned long long)width);
    size_t id_bytes = size - DATA_TOKENS_HEADER_BYTES;
    if (id_bytes % width != 0 || id_bytes / width != count) /* by division: count * width may overflow */
        return fail(loader, "the header says %llu ids of %llu bytes, but %zu bytes follow its %d-byte header",
                    (unsigned long long)count, (unsigned long long)width, id_bytes, DATA_TOKENS_HEADER_BYTES);
    *layout = (token_file_layout){DATA_TOKENS_HEADER_BYTES, (int)width, (size_t)count};
    return 0;
}

static int refuse_id(data_loader *loader, uint64_t id, size_t position) {
    return fail(loader, "token id %llu at position %zu is outside the vocabulary (vocab_size %d)%s",
                (unsigned long long)id, position, loader->vocab_size, id == DATA_EOT ? "; it is <|endoftext|>" : "");
}

/* A token file, read in chunks straight into the stream in the loader's width (so the only data memory is the
 * stream itself, whatever the file's width). An id too wide for the stream is outside the vocabulary: refused here,
 * before it could be narrowed. */
static int load_bin(data_loader *loader, const char *path) {
    FILE *file = NULL;
    size_t size = 0;
    if (open_regular(loader, path, &file, &size) != 0) return -1;
    token_file_layout layout = {0, 2, 0};
    int status = token_file_layout_of(loader, file, size, &layout);
    if (status == 0 && fseek(file, (long)layout.ids_offset, SEEK_SET) != 0)
        status = fail(loader, "cannot seek to its ids: %s", strerror(errno));
    if (status != 0) {
        fclose(file);
        return -1;
    }
    allocate_stream(loader, layout.count);
    unsigned char chunk[1 << 16];
    size_t per_chunk = sizeof chunk / (size_t)layout.width, done = 0;
    while (status == 0 && done < layout.count) {
        size_t want = layout.count - done < per_chunk ? layout.count - done : per_chunk;
        size_t got = fread(chunk, (size_t)layout.width, want, file);
        for (size_t i = 0; i < got && status == 0; i++) {
            uint64_t id = get_le(chunk + i * (size_t)layout.width, layout.width);
            if (id >= (uint64_t)1 << (8 * loader->token_width)) status = refuse_id(loader, id, done + i);
            else set_token(loader, done + i, (uint32_t)id);
        }
        if (status == 0 && got < want)
            status = fail(loader, "read %zu of %zu bytes%s", layout.ids_offset + (done + got) * (size_t)layout.width,
                          size, ferror(file) ? " (read error)" : "");
        done += got;
    }
    fclose(file);
    if (status != 0) {
        mem_free(offload_data_pool(loader->ctx), loader->tokens);
        loader->tokens = NULL;
    }
    return status;
}

int data_write_tokens(const char *path, const int *ids, size_t count, int width, char *error, size_t error_size) {
    if (width != 2 && width != 4)
        return error_set(error, error_size, "%s: id width %d; token files hold 2 or 4 bytes per id", path, width);
    for (size_t i = 0; i < count; i++)
        if (ids[i] < 0 || (width == 2 && ids[i] > 65535))
            return error_set(error, error_size, "%s: id %d at position %zu does not fit in %d bytes", path, ids[i], i,
                             width);
    char tmp[4200];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return error_set(error, error_size, "%s: the path is too long", path);
    FILE *file = fopen(tmp, "wb");
    if (file == NULL) return error_set(error, error_size, "cannot create %s: %s", tmp, strerror(errno));
    unsigned char chunk[1 << 16];
    memcpy(chunk, DATA_TOKENS_MAGIC, sizeof DATA_TOKENS_MAGIC - 1);
    put_le(chunk + 8, DATA_TOKENS_VERSION, 4);
    put_le(chunk + 12, (uint64_t)width, 4);
    put_le(chunk + 16, count, 8);
    int ok = fwrite(chunk, 1, DATA_TOKENS_HEADER_BYTES, file) == DATA_TOKENS_HEADER_BYTES;
    size_t per_chunk = sizeof chunk / (size_t)width;
    for (size_t done = 0; ok && done < count; done += per_chunk) {
        size_t n = count - done < per_chunk ? count - done : per_chunk;
        for (size_t i = 0; i < n; i++) put_le(chunk + i * (size_t)width, (uint64_t)ids[done + i], width);
        ok = fwrite(chunk, (size_t)width, n, file) == n;
    }
    int write_errno = errno;
    if (fclose(file) != 0 && ok) ok = 0, write_errno = errno;
    if (!ok) {
        unlink(tmp);
        return error_set(error, error_size, "cannot write %s: %s", tmp, strerror(write_errno));
    }
    if (file_commit(tmp, path, error, error_size) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

static int check_stream(data_loader *loader) {
    for (size_t i = 0; i < loader->token_count; i++)
        if (data_token(loader, i) >= (uint32_t)loader->vocab_size) return refuse_id(loader, data_token(loader, i), i);
    if (loader->token_count < (size_t)loader->seq_len + 1)
        return fail(loader, "%zu tokens, fewer than seq_len + 1 = %d (one window with its last target)",
                    loader->token_count, loader->seq_len + 1);
    return 0;
}

int data_loader_open(data_loader *loader, context *ctx, const char *path, int vocab_size, int micro_batch,
                     int seq_len, uint64_t seed, int shuffle) {
    return data_loader_open_tokenized(loader, ctx, path, NULL, vocab_size, micro_batch, seq_len, seed, shuffle);
}

int data_loader_open_tokenized(data_loader *loader, context *ctx, const char *path, tok_tokenizer *tokenizer,
                               int vocab_size, int micro_batch, int seq_len, uint64_t seed, int shuffle) {
    memset(loader, 0, sizeof *loader);
    loader->ctx = ctx;
    loader->tokenizer = tokenizer;
    loader->vocab_size = vocab_size;
    loader->micro_batch = micro_batch;
    loader->seq_len = seq_len;
    loader->rank = ctx->rank;
    loader->world_size = ctx->world_size;
    loader->seed = seed;
    loader->shuffle = shuffle != 0;
    loader->token_width = data_token_width(vocab_size);
    int generated = path == NULL || path[0] == '\0';
    const char *by = tokenizer != NULL && (generated || !ends_with(path, ".bin")) ? ", Qwen2 tokenizer" : "";
    if (generated)
        snprintf(loader->source, sizeof loader->source, "generated stories (seed %llu, %d stories%s)",
                 (unsigned long long)seed, DATA_DEFAULT_STORIES, by);
    else
        snprintf(loader->source, sizeof loader->source, "%s%s%s%s", path, by[0] ? " (" : "", by[0] ? by + 2 : "",
                 by[0] ? ")" : "");

    int status = 0;
    if (micro_batch < 1 || seq_len < 1 || vocab_size < 1)
        status = fail(loader, "micro_batch %d, seq_len %d and vocab_size %d must all be at least 1", micro_batch,
                      seq_len, vocab_size);
    else if (generated) status = load_generated(loader);
    else if (ends_with(path, ".bin")) status = load_bin(loader, path);
    else status = load_text(loader, path);
    if (status == 0) status = check_stream(loader);

    /* Every rank goes on, or none does: a rank left behind would wait forever in the step's first collective. */
    if (!world_all_true(ctx, status == 0)) { /* a rank that loaded its data now holds the failing rank's message */
        data_loader_close(loader);
        return -1;
    }
    loader->window_starts = loader->token_count - (size_t)seq_len;
    loader->windows_per_pass = loader->window_starts / (size_t)seq_len;
    if (loader->windows_per_pass == 0) loader->windows_per_pass = 1;
    return 0;
}

/* A bijection of [0, count) keyed by (seed, pass): a 4-round Feistel network over the smallest power of 4 that
 * covers count, applied again while the result falls outside [0, count) ("cycle walking": following the
 * permutation's cycle until it comes back into range keeps it a bijection of [0, count)). Counter-based: any
 * window's place is computed alone, without shuffling a table. */
static uint64_t permute(uint64_t index, uint64_t count, uint64_t seed, uint64_t pass) {
    int half_bits = 1;
    while (half_bits < 32 && (1ull << (2 * half_bits)) < count) half_bits++;
    uint64_t mask = (1ull << half_bits) - 1, stream = rng_stream_of("data.shuffle") + pass;
    do {
        uint64_t left = index >> half_bits, right = index & mask;
        for (uint64_t round = 0; round < 4; round++) {
            uint64_t mixed = left ^ (rng_bits(seed, stream, round << 32 | right) & mask);
            left = right;
            right = mixed;
        }
        index = left << half_bits | right;
    } while (index >= count);
    return index;
}

size_t data_window_start(const data_loader *loader, uint64_t global_window) {
    uint64_t window = global_window;
    if (loader->shuffle) {
        uint64_t pass = global_window / loader->windows_per_pass;
        uint64_t slot = global_window % loader->windows_per_pass;
        window = pass * loader->windows_per_pass + permute(slot, loader->windows_per_pass, loader->seed, pass);
    }
    return (size_t)((window * (uint64_t)loader->seq_len) % loader->window_starts);
}

void data_next_batch(data_loader *loader, int *tokens, int *targets) {
    int T = loader->seq_len;
    uint64_t global_batch = (uint64_t)loader->world_size * (uint64_t)loader->micro_batch;
    uint64_t first_window = loader->next_global_micro * global_batch + (uint64_t)loader->rank * loader->micro_batch;
    for (int b = 0; b < loader->micro_batch; b++) {
        size_t start = data_window_start(loader, first_window + (uint64_t)b);
        for (int t = 0; t < T; t++) {
            tokens[(size_t)b * T + t] = (int)data_token(loader, start + (size_t)t);
            targets[(size_t)b * T + t] = (int)data_token(loader, start + (size_t)t + 1);
        }
    }
    loader->next_global_micro++;
}

void data_loader_close(data_loader *loader) {
    if (loader->ctx != NULL) mem_free(offload_data_pool(loader->ctx), loader->tokens);
    loader->tokens = NULL;
    loader->token_count = 0;
    loader->token_bytes = 0;
}

/* ---- which tokenizer (TOKENIZER) ---- */

tok_tokenizer *data_tokenizer_from_env(context *ctx, int vocab_size, char *note, size_t note_size) {
    const char *setting = env_text(ctx, "TOKENIZER");
    if (setting == NULL || setting[0] == '\0') setting = "auto";
    int is_auto = strcmp(setting, "auto") == 0, named = is_auto || strcmp(setting, "qwen2") == 0;
    const char *path = named ? tok_default_path() : setting;
    int qwen2_sized = vocab_size >= TOK_QWEN2_ENDOFTEXT_ID + 3; /* the three specials after the ranked tokens */
    note[0] = '\0';
    if (strcmp(setting, "bytes") == 0 || (is_auto && !qwen2_sized)) {
        snprintf(note, note_size, "text as byte ids (TOKENIZER=%s, vocab_size %d)", setting, vocab_size);
        return NULL;
    }
    if (is_auto) { /* the same answer on every rank, or a multi-machine run would tokenize two ways */
        struct stat info;
        if (!world_all_true(ctx, stat(path, &info) == 0)) {
            snprintf(note, note_size, "text as byte ids: TOKENIZER=auto found no Qwen2 vocabulary at %s "
                     "(scripts/get_qwen2_tokenizer.sh fetches it)", path);
            return NULL;
        }
    }
    tok_tokenizer *tokenizer = calloc(1, sizeof *tokenizer);
    if (tokenizer == NULL) world_fatal(ctx, "out of memory for the tokenizer");
    char error[1024];
    int ok = tok_load(tokenizer, path, error, sizeof error) == 0;
    if (ok && tok_vocab_size(tokenizer) > vocab_size) {
        snprintf(error, sizeof error, "%s has ids up to %d, beyond this model's vocab_size %d (MODEL=qwen2-0.5b has "
                 "Qwen2's vocabulary; TOKENIZER=bytes reads text as bytes)", tokenizer->source,
                 tok_vocab_size(tokenizer) - 1, vocab_size);
        tok_free(tokenizer);
        ok = 0;
    }
    if (!ok) snprintf(ctx->error, sizeof ctx->error, "rank %d: %s", ctx->rank, error);
    if (!world_all_true(ctx, ok)) {
        if (ok) tok_free(tokenizer);
        free(tokenizer);
        world_exit_all(ctx, 2, "TOKENIZER='%s': %s%s", setting, ctx->error,
                     named && stat(path, &(struct stat){0}) != 0
                         ? " (scripts/get_qwen2_tokenizer.sh fetches Qwen2's vocabulary)" : "");
    }
    snprintf(note, note_size, "text through Qwen2's tokenizer (%s, %d ids)", tokenizer->source,
             tok_vocab_size(tokenizer));
    return tokenizer;
}
