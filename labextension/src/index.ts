/**
 * elasticdl-nb's JupyterLab extension: the "ElasticDL" sidebar listing the jobs of the
 * server extension's API, with scale, stop, logs and "attach in notebook".
 *
 * Commands (usable from the palette or `app.commands.execute`):
 *
 *     elasticdl:show-jobs          open the sidebar
 *     elasticdl:open-logs {name}   a job's logs in the main area
 *     elasticdl:attach {name}      insert `%elasticdl attach NAME` below the active cell
 */
import {
  ILayoutRestorer,
  JupyterFrontEnd,
  JupyterFrontEndPlugin
} from '@jupyterlab/application';
import {
  Dialog,
  ICommandPalette,
  MainAreaWidget,
  Notification,
  WidgetTracker,
  showDialog
} from '@jupyterlab/apputils';
import { INotebookTracker, NotebookActions } from '@jupyterlab/notebook';
import { ISettingRegistry } from '@jupyterlab/settingregistry';

import { ApiError, IJobSummary, JobsClient } from './api';
import { IJobActions } from './jobRow';
import { LogsView, createLogsWidget } from './logs';
import { JobsPanel } from './panel';

const PLUGIN_ID = 'elasticdl-nb:plugin';

namespace CommandIDs {
  export const showJobs = 'elasticdl:show-jobs';
  export const openLogs = 'elasticdl:open-logs';
  export const attach = 'elasticdl:attach';
}

/** The settings of schema/plugin.json. */
interface ISidebarSettings {
  refreshInterval: number;
  defaultNamespace: string;
}

const DEFAULTS: ISidebarSettings = { refreshInterval: 2, defaultNamespace: '' };

const plugin: JupyterFrontEndPlugin<void> = {
  id: PLUGIN_ID,
  description:
    'The ElasticDL jobs sidebar: progress, scale, stop, logs, attach.',
  autoStart: true,
  requires: [INotebookTracker],
  optional: [ISettingRegistry, ILayoutRestorer, ICommandPalette],
  activate: async (
    app: JupyterFrontEnd,
    notebooks: INotebookTracker,
    settingRegistry: ISettingRegistry | null,
    restorer: ILayoutRestorer | null,
    palette: ICommandPalette | null
  ): Promise<void> => {
    const client = new JobsClient(app.serviceManager.serverSettings);
    const settings = { ...DEFAULTS };
    const namespaceOf = (job: IJobSummary) =>
      job.remote ? settings.defaultNamespace : '';

    const actions: IJobActions = {
      scale: async (job, workers) => {
        try {
          const result = await client.scale(
            job.name,
            workers,
            namespaceOf(job)
          );
          Notification.info(
            `${job.name}: ${result.workers_from} → ${result.workers_to} workers`,
            { autoClose: 3000 }
          );
        } catch (error) {
          notifyFailure(`Could not scale ${job.name}`, error);
        }
        panel.refreshSoon();
      },
      stop: async job => {
        const answer = await showDialog({
          title: `Stop ${job.name}?`,
          body:
            'Its master, workers and parameter servers are stopped; ' +
            'the training cannot be resumed.',
          buttons: [
            Dialog.cancelButton(),
            Dialog.warnButton({ label: 'Stop job' })
          ]
        });
        if (!answer.button.accept) {
          return;
        }
        try {
          const summary = await client.stop(job.name, namespaceOf(job));
          panel.row(job.name)?.update({ ...job, ...summary }); // the list's `created` stays
        } catch (error) {
          notifyFailure(`Could not stop ${job.name}`, error);
        }
        panel.refreshSoon();
      },
      openLogs: job =>
        void app.commands.execute(CommandIDs.openLogs, { name: job.name }),
      attach: job =>
        void app.commands.execute(CommandIDs.attach, {
          name: job.name,
          namespace: namespaceOf(job)
        })
    };

    const panel = new JobsPanel({
      client,
      actions,
      refreshInterval: settings.refreshInterval,
      namespace: settings.defaultNamespace
    });

    if (settingRegistry) {
      try {
        const loaded = await settingRegistry.load(PLUGIN_ID);
        const apply = () => {
          settings.refreshInterval = loaded.get('refreshInterval')
            .composite as number;
          settings.defaultNamespace = (
            loaded.get('defaultNamespace').composite as string
          ).trim();
          panel.configure(settings.refreshInterval, settings.defaultNamespace);
        };
        apply();
        loaded.changed.connect(apply);
      } catch (error) {
        console.warn(
          `${PLUGIN_ID}: settings not loaded, using defaults`,
          error
        );
      }
    }

    app.shell.add(panel, 'left', { rank: 650 });
    restorer?.add(panel, panel.id);

    const logsTracker = new WidgetTracker<MainAreaWidget<LogsView>>({
      namespace: 'elasticdl-nb-logs'
    });
    void restorer?.restore(logsTracker, {
      command: CommandIDs.openLogs,
      args: widget => ({ name: widget.content.jobName }),
      name: widget => widget.content.jobName
    });

    app.commands.addCommand(CommandIDs.showJobs, {
      label: 'ElasticDL: Show Jobs',
      caption: 'Open the ElasticDL jobs sidebar',
      execute: () => app.shell.activateById(panel.id)
    });

    app.commands.addCommand(CommandIDs.openLogs, {
      label: args => `Logs of ${args.name as string}`,
      caption: 'Open a job’s logs in the main area',
      execute: args => {
        const name = args.name as string;
        const open = logsTracker.find(w => w.content.jobName === name);
        if (open) {
          app.shell.activateById(open.id);
          return open;
        }
        const widget = createLogsWidget(name, client, settings.refreshInterval);
        void logsTracker.add(widget);
        app.shell.add(widget, 'main');
        app.shell.activateById(widget.id);
        return widget;
      }
    });

    app.commands.addCommand(CommandIDs.attach, {
      label: args => `Attach ${args.name as string} in the notebook`,
      caption: 'Insert `%elasticdl attach NAME` below the active cell',
      execute: args =>
        attachInNotebook(
          app,
          notebooks,
          args.name as string,
          (args.namespace as string) || ''
        )
    });

    palette?.addItem({ command: CommandIDs.showJobs, category: 'ElasticDL' });
  }
};

/**
 * Insert a code cell `%elasticdl attach NAME` below the active cell of the current
 * notebook (preceded by `%load_ext elasticdl_nb` when no cell of the notebook loads it),
 * and show the notebook. The user runs it: it shows the job's dashboard.
 */
function attachInNotebook(
  app: JupyterFrontEnd,
  notebooks: INotebookTracker,
  name: string,
  namespace: string
): void {
  const current = notebooks.currentWidget;
  if (!current) {
    Notification.warning(
      `Open a notebook first: "attach" inserts %elasticdl attach ${name} into it.`,
      { autoClose: 5000 }
    );
    return;
  }
  const notebook = current.content;
  const loaded = Array.from(notebook.model?.cells ?? []).some(cell =>
    /^\s*%(load_ext|reload_ext)\s+elasticdl_nb|^\s*%%?elasticdl\b/m.test(
      cell.sharedModel.getSource()
    )
  );
  let source = `%elasticdl attach ${name}`;
  if (namespace) {
    source += ` --namespace ${namespace}`;
  }
  if (!loaded) {
    source = `%load_ext elasticdl_nb\n${source}`;
  }
  app.shell.activateById(current.id);
  NotebookActions.insertBelow(notebook);
  NotebookActions.changeCellType(notebook, 'code');
  notebook.activeCell?.model.sharedModel.setSource(source);
  notebook.activeCell?.node.scrollIntoView({ block: 'nearest' });
}

/** One notification for a failed action, with the server's own explanation. */
function notifyFailure(what: string, error: unknown): void {
  const reason =
    error instanceof ApiError || error instanceof Error
      ? error.message
      : String(error);
  Notification.error(`${what}: ${reason}`, { autoClose: 8000 });
}

export default plugin;
