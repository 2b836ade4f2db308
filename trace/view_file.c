/* view_file.c — see view_file.h. */
#include "view_file.h"
#include "palette.h"
#include "run.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <string.h>

int view_path(char *path, size_t path_size, const char *rundir, const char *out_path, const char *default_name,
              char *error, size_t error_size) {
    int written = out_path != NULL ? snprintf(path, path_size, "%s", out_path)
                                   : snprintf(path, path_size, "%s/%s", rundir, default_name);
    if (written >= 0 && (size_t)written < path_size) return 0;
    snprintf(error, error_size, "output path too long: %s/%s", rundir, out_path != NULL ? out_path : default_name);
    return -1;
}

int view_file_open(view_file *view, const char *path, char *error, size_t error_size) {
    memset(view, 0, sizeof *view);
    int written = snprintf(view->path, sizeof view->path, "%s", path);
    int temporary_written = snprintf(view->temporary_path, sizeof view->temporary_path, "%s.tmp", path);
    if (written < 0 || (size_t)written >= sizeof view->path || temporary_written < 0 ||
        (size_t)temporary_written >= sizeof view->temporary_path) {
        snprintf(error, error_size, "output path too long: %s", path);
        return -1;
    }
    view->file = fopen(view->temporary_path, "w");
    if (view->file != NULL) return 0;
    snprintf(error, error_size, "cannot write %s: %s", view->temporary_path, strerror(errno));
    return -1;
}

int view_file_close(view_file *view, int status, char *error, size_t error_size) {
    if (view->file == NULL) return -1;
    int write_failed = ferror(view->file);
    if (fclose(view->file) != 0) write_failed = 1;
    view->file = NULL;
    if (status == 0 && write_failed) {
        snprintf(error, error_size, "cannot write %s: %s", view->temporary_path, strerror(errno));
        status = -1;
    }
    if (status == 0 && rename(view->temporary_path, view->path) != 0) {
        snprintf(error, error_size, "cannot rename %s to %s: %s", view->temporary_path, view->path, strerror(errno));
        status = -1;
    }
    if (status != 0) remove(view->temporary_path);
    return status;
}

void view_html_text_put(FILE *file, const char *text) {
    for (; *text; text++) {
        if (*text == '<') fputs("&lt;", file);
        else if (*text == '>') fputs("&gt;", file);
        else if (*text == '&') fputs("&amp;", file);
        else if (*text == '"') fputs("&quot;", file);
        else fputc(*text, file);
    }
}

/* Inside <script> only "</" can end the element early; "<\/" is the same JSON string. */
void view_script_json_put(FILE *file, const char *json) {
    for (; *json; json++) {
        fputc(*json, file);
        if (json[0] == '<' && json[1] == '/') fputc('\\', file);
    }
}

void view_html_head_put(FILE *file, const char *title_prefix, const char *rundir, const char *style) {
    fputs("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n", file);
    fputs("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>", file);
    view_html_text_put(file, title_prefix);
    view_html_text_put(file, rundir);
    fputs("</title>\n<link rel=\"icon\" href=\"data:,\">\n<style>\n", file);
    fputs(style, file);
    fputs("</style>\n</head>\n", file);
}

int view_html_write(const char *out_path, const struct trace_run *run, cJSON *data, view_page_writer page_put,
                    char *error, size_t error_size) {
    char *json = data != NULL ? cJSON_PrintUnformatted(data) : NULL;
    cJSON_Delete(data);
    if (json == NULL) {
        snprintf(error, error_size, "out of memory building the data of %s", out_path);
        return -1;
    }
    view_file view;
    int status = view_file_open(&view, out_path, error, error_size);
    if (status == 0) {
        page_put(view.file, run, json);
        status = view_file_close(&view, 0, error, error_size);
    }
    cJSON_free(json);
    return status;
}

static cJSON *palette_object(const palette_color *colors, int count) {
    cJSON *object = cJSON_CreateObject();
    for (int index = 0; object != NULL && index < count; index++) {
        if (cJSON_AddStringToObject(object, colors[index].name, colors[index].color) == NULL) {
            cJSON_Delete(object);
            return NULL;
        }
    }
    return object;
}

int view_palette_add(cJSON *data) {
    for (int index = 0; index < RUN_CATEGORY_COUNT; index++)
        if (strcmp(palette_categories[index].name, run_categories[index]) != 0) return -1;
    cJSON *palette = data != NULL ? cJSON_AddObjectToObject(data, "palette") : NULL;
    if (palette == NULL) return -1;
    cJSON *categories = palette_object(palette_categories, RUN_CATEGORY_COUNT);
    if (categories == NULL || !cJSON_AddItemToObject(palette, "categories", categories)) {
        cJSON_Delete(categories);
        return -1;
    }
    cJSON *states = palette_object(palette_states, PALETTE_STATE_COUNT);
    if (states == NULL || !cJSON_AddItemToObject(palette, "states", states)) {
        cJSON_Delete(states);
        return -1;
    }
    return 0;
}
